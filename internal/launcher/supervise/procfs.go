package supervise

import (
	"bytes"
	"fmt"
	"os"
	"strconv"

	"github.com/gotrain/gotrain/internal/procstat"

	"golang.org/x/sys/unix"
)

// procStat returns the fields of /proc/PID/stat after the command name
// (state, ppid, ...); nil when it cannot be read.
func procStat(pid int) []string { return procstat.Fields(pid) }

// procInfo is what a scan needs of one process.
type procInfo struct {
	pid, ppid, pgid int
	state           string // "R", "S", "Z", ...
	start           uint64 // start time in clock ticks since boot: with pid, an identity
}

// parseProcInfo reads the fields of procStat: f[0] is field 3 (state), f[1]
// the ppid, f[2] the process group, f[19] field 22 (starttime).
func parseProcInfo(pid int, f []string) (procInfo, bool) {
	if len(f) < 20 {
		return procInfo{}, false
	}
	ppid, err1 := strconv.Atoi(f[1])
	pgid, err2 := strconv.Atoi(f[2])
	start, err3 := strconv.ParseUint(f[19], 10, 64)
	if err1 != nil || err2 != nil || err3 != nil {
		return procInfo{}, false
	}
	return procInfo{pid: pid, ppid: ppid, pgid: pgid, state: f[0], start: start}, true
}

// readProc reads one process's procInfo.
func readProc(pid int) (procInfo, bool) { return parseProcInfo(pid, procStat(pid)) }

// readAllProcs lists every process in /proc (processes, not threads).
func readAllProcs() ([]procInfo, error) {
	d, err := os.Open("/proc")
	if err != nil {
		return nil, err
	}
	defer d.Close()
	names, err := d.Readdirnames(-1)
	if err != nil {
		return nil, fmt.Errorf("read /proc: %w", err)
	}
	out := make([]procInfo, 0, len(names))
	for _, n := range names {
		pid, err := strconv.Atoi(n)
		if err != nil || pid <= 0 {
			continue
		}
		if p, ok := readProc(pid); ok {
			out = append(out, p)
		}
	}
	return out, nil
}

// procEnv returns the value of key in the environment a process was started
// with ("" when absent or unreadable).
func procEnv(pid int, key string) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
	if err != nil {
		return ""
	}
	prefix := []byte(key + "=")
	for kv := range bytes.SplitSeq(b, []byte{0}) {
		if v, ok := bytes.CutPrefix(kv, prefix); ok {
			return string(v)
		}
	}
	return ""
}

// killPid sends SIGKILL to pid if it is still the process that started at
// start. Through a pidfd the check and the signal cannot be fooled by the
// pid's reuse in between; without pidfds (Linux < 5.3) a plain kill follows
// the check.
func killPid(pid int, start uint64) {
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		if err == unix.ENOSYS {
			if p, ok := readProc(pid); ok && p.start == start {
				_ = unix.Kill(pid, unix.SIGKILL)
			}
		}
		return // ESRCH: gone
	}
	defer unix.Close(fd)
	if p, ok := readProc(pid); !ok || p.start != start {
		return
	}
	_ = unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0)
}

// Early exit detection. wait4 reports a process only once the kernel has
// torn it down, and a process with a CUDA context takes tens of milliseconds
// for that after its last thread stopped running its code (2 × H200: 42–51
// ms of the ~100 ms between a worker's crash and wait4, measured with
// bench/restart_quick.sh). The kernel closes the process's descriptors early
// in that teardown, so its output pipes reach EOF first; at that moment, if
// /proc says the process is exiting (PF_EXITING, or already a zombie), its
// exit status is final (/proc/PID/stat's exit_code, as waitpid reports it),
// and Exited closes without waiting for wait4. A process that closed its
// output and runs on is not exiting (every thread must be in do_exit) and is
// left to wait4, as is one whose children hold its pipes (they have not
// reached EOF). Done still closes only when the process is reaped.

// pfExiting is the kernel's PF_EXITING task flag: the task is in do_exit.
const pfExiting = 0x4

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
		if !threadExiting(procstat.Parse(string(b))) {
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
