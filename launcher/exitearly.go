package launcher

import (
	"strconv"

	"golang.org/x/sys/unix"
)

// Early exit detection. wait4 reports a worker only once the kernel has torn
// it down, and a process with a CUDA context takes tens of milliseconds for
// that after its last thread stopped running its code (2 × H200: 42–51 ms of
// the ~100 ms between a worker's crash and wait4, measured with
// bench/restart_quick.sh). The kernel closes the process's descriptors early
// in that teardown, so its output pipes reach EOF first; at that moment, if
// /proc says the process is exiting (PF_EXITING, or already a zombie), its
// exit status is final (/proc/PID/stat's exit_code, as waitpid reports it),
// and the agent acts on it without waiting for wait4: the generation ends
// and the next one starts that much sooner. A worker that closed its output
// and runs on is not exiting and is left to wait4, as is one whose children
// hold its pipes (they have not reached EOF). workerProc.done still closes
// only when the worker is reaped and its group killed.

// pfExiting is the kernel's PF_EXITING task flag: the task is in do_exit.
const pfExiting = 0x4

// exitEarly runs when both output pipes reached EOF: it records the exit if
// the worker is exiting and wait4 has not reaped it yet (then the pid might
// already name another process).
func (p *workerProc) exitEarly() {
	if p.reaped.Load() {
		return
	}
	ws, ok := exitingStatus(procStat(p.pidNum))
	if !ok || p.reaped.Load() {
		return
	}
	p.setExit(exitFromStatus(ws, nil), true)
}

// exitingStatus reads the fields of /proc/PID/stat after the command name
// (procStat): when the process is exiting it returns its exit status.
func exitingStatus(f []string) (unix.WaitStatus, bool) {
	// f[0] is field 3 (state), f[6] field 9 (flags), f[49] field 52
	// (exit_code, Linux 3.5 and newer).
	if len(f) < 50 {
		return 0, false
	}
	flags, err := strconv.ParseUint(f[6], 10, 64)
	if err != nil {
		return 0, false
	}
	if state := f[0]; state != "Z" && state != "X" && flags&pfExiting == 0 {
		return 0, false
	}
	code, err := strconv.Atoi(f[49])
	if err != nil {
		return 0, false
	}
	return unix.WaitStatus(code), true
}
