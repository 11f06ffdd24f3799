// Package output is where the workers' output goes: onto gotrain's
// console, whole lines under "[rank N] " (a Console keeps concurrent ranks
// from interleaving within a line) or raw, filtered by --redirects and
// --console-ranks (Options), into each rank's log file under --log-dir
// (a run's own LOGDIR/RUN_ID/attempt-N, never through a link), and the
// last lines of a worker's stderr for its exit report (Tail). A Route is
// one worker's way there; it follows the process when a standby becomes a
// rank or a survivor changes rank.
//
// It is separate from the agent (package launcher) because it is the one
// place that writes the workers' bytes: it knows ranks only as numbers and
// nothing of the agent's machine or of the coordinator.
package output
