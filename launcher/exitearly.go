package launcher

import (
	"fmt"
	"os"
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
// and runs on is not exiting (every thread must be in do_exit) and is left
// to wait4, as is one whose children hold its pipes (they have not reached
// EOF). workerProc.done still closes
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
	if !ok || !allThreadsExiting(p.pidNum) || p.reaped.Load() {
		return
	}
	p.setExit(exitFromStatus(ws, nil), true)
}

// allThreadsExiting says whether every thread of pid still listed is in
// do_exit: a main thread that ended alone (pthread_exit) leaves a zombie
// leader while the other threads run on, which is no exit.
func allThreadsExiting(pid int) bool {
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		return false
	}
	for _, t := range tasks {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/stat", pid, t.Name()))
		if err != nil {
			continue // gone meanwhile
		}
		if !threadExiting(parseProcStat(string(b))) {
			return false
		}
	}
	return true
}

// threadExiting reads the fields of a thread's stat after the command name.
func threadExiting(f []string) bool {
	if len(f) < 7 {
		return false
	}
	if f[0] == "Z" || f[0] == "X" {
		return true
	}
	flags, err := strconv.ParseUint(f[6], 10, 64)
	return err == nil && flags&pfExiting != 0
}

// exitingStatus reads the fields of /proc/PID/stat after the command name
// (procStat): when the process is exiting it returns its exit status.
func exitingStatus(f []string) (unix.WaitStatus, bool) {
	// f[0] is field 3 (state), f[6] field 9 (flags), f[49] field 52
	// (exit_code, Linux 3.5 and newer).
	if len(f) < 50 {
		return 0, false
	}
	if !threadExiting(f) {
		return 0, false
	}
	code, err := strconv.Atoi(f[49])
	if err != nil {
		return 0, false
	}
	return unix.WaitStatus(code), true
}
