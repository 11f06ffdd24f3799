// Package explain writes the lines a person reads about the job's course:
// a restart ("gotrain: rank 2 on node3 exited 1 (ImportError: ...):
// restarting all 8 ranks, ..."), the job a node joined, a hang or
// straggler verdict, the report of a failed job, and whether a rank's
// failure can only repeat (PermanentCause, which the exit report carries).
//
// It is separate from the agent (package launcher) because it is pure text
// from the coordinator's messages and a worker's stderr tail: no I/O, no
// state, tested on its own.
package explain
