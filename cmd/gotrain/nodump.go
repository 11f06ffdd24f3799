package main

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// keepMemoryPrivate makes this process non-dumpable (PR_SET_DUMPABLE 0):
// its workers run as the same user, and without it any of them could read
// the node's key, the job CA's key and the job token out of
// /proc/AGENT/mem (or ptrace the agent). Non-dumpable, the agent's /proc
// entries belong to root and only a process with CAP_SYS_PTRACE reaches its
// memory; it writes no core dump either. Children get their own setting
// back when they exec, so workers stay debuggable (py-spy, gotrain
// diagnose). It runs before any key or token is loaded: a copy in memory
// from before would be readable until then.
func keepMemoryPrivate() error {
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		return fmt.Errorf("gotrain: cannot keep its memory from its workers (prctl PR_SET_DUMPABLE 0: %w); the job's keys would be readable by any process of yours: run on Linux, or report this", err)
	}
	return nil
}
