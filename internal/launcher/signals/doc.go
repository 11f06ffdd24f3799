// Package signals owns SIGINT and SIGTERM for `gotrain launch` and
// `gotrain coordinator`: StopOnSignal turns the first into the end of the
// run's context, its cause a *Stopped naming the phase the code declared
// last (SetPhase), and passes later signals on for the agent's loop.
//
// It is separate from the agent (package launcher) because the waits it
// ends start before any agent does (cmd/gotrain's, cmd/gotrain/internal/slurm's token
// exchange and follower tasks): they need the stop, not the agent.
package signals
