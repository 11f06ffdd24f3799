// Package agentcore is the agent's decisions, as a pure state machine: what
// `gotrain launch` does on its node when the coordinator starts or ends a
// generation, a worker exits or attaches, a standby says hello, a signal
// arrives or time passes. It is the agent's counterpart of internal/coordinator/job.
//
// Events go in through [Machine.Step] with the time; actions come out, for
// the agent's shell (package launcher) to carry out: start a rank's worker
// with its identity (jobenv.Identity), signal a process group, report an
// exit or a park to the coordinator, hand a rank to a standby, resume a
// survivor, stop, finish with an exit code. The machine does no I/O, reads
// no clock and starts no goroutine; the shell turns what happens to the
// processes and streams back into events (Spawned, Exited, Attached,
// HandoverFailed ...). Processes are named by a ProcID the machine chooses
// when it asks for one; the shell maps it to the real process.
//
// What it decides:
//   - a generation's ranks: a survivor of the previous generation that
//     recovers in process is handed the new one (Resume); any other process
//     left over is stopped; a rank gets its slot's ready standby
//     (HandToStandby) or a new process (Spawn);
//   - a generation's end: workers that recover in process are parked (told
//     the end and reported as accounted for), the others are told the end
//     and stopped (SIGTERM, then SIGKILL after the grace period);
//   - a worker's exit is reported to the coordinator, a standby's exit
//     replaces the standby (or turns standbys off for good, standby.go);
//   - SIGINT/SIGTERM stop the job (a second one kills at once), other
//     signals are passed on; the job finishes when the coordinator says so,
//     when it is lost, or when the agent is canceled, once every worker has
//     exited.
//
// Golden transcripts of these decisions are in testdata/ (run with -rewrite
// to regenerate them: github.com/cockroachdb/datadriven).
package agentcore
