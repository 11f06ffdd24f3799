package launcher

import (
	"os/exec"
	"strconv"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// statFields builds /proc/PID/stat fields after the command name with the
// given state, flags and exit_code.
func statFields(state string, flags uint64, exitCode int) []string {
	f := make([]string, 50)
	for i := range f {
		f[i] = "0"
	}
	f[0] = state
	f[6] = strconvU(flags)
	f[49] = strconvU(uint64(exitCode))
	return f
}

func strconvU(v uint64) string { return strconv.FormatUint(v, 10) }

func TestExitingStatus(t *testing.T) {
	for _, tc := range []struct {
		name   string
		f      []string
		ok     bool
		code   int
		signal unix.Signal
	}{
		{"running", statFields("S", 0x400040, 0), false, 0, 0},
		{"exiting with 3", statFields("R", 0x400044, 3<<8), true, 3, 0},
		{"exiting, killed", statFields("D", 0x404, int(unix.SIGKILL)), true, -1, unix.SIGKILL},
		{"zombie, exit 0", statFields("Z", 0x400040, 0), true, 0, 0},
		{"short (old kernel)", []string{"R", "1"}, false, 0, 0},
		{"unreadable", nil, false, 0, 0},
	} {
		ws, ok := exitingStatus(tc.f)
		if ok != tc.ok {
			t.Errorf("%s: ok = %t, want %t", tc.name, ok, tc.ok)
			continue
		}
		if !ok {
			continue
		}
		e := exitFromStatus(ws, nil)
		if e.code != tc.code || e.signal != tc.signal {
			t.Errorf("%s: exit %+v, want code %d signal %v", tc.name, e, tc.code, tc.signal)
		}
	}
}

// A live process's own /proc entry is not exiting, whatever it did to its
// output; a zombie's is, with the status wait4 then reports.
func TestExitingStatusOfRealProcesses(t *testing.T) {
	if _, ok := exitingStatus(procStat(unix.Getpid())); ok {
		t.Error("this test process reads as exiting")
	}
	cmd := exec.Command("sh", "-c", "exit 7")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pid := cmd.Process.Pid
	deadline := time.Now().Add(5 * time.Second)
	for {
		ws, ok := exitingStatus(procStat(pid))
		if ok {
			if e := exitFromStatus(ws, nil); e.code != 7 {
				t.Errorf("zombie's exit %+v, want code 7", e)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the child never read as exiting")
		}
		time.Sleep(5 * time.Millisecond)
	}
	_ = cmd.Wait()
}

// exitEarly records a zombie's exit before anyone reaps it, and nothing
// once wait4 has (the pid may name another process by then).
func TestExitEarly(t *testing.T) {
	cmd := exec.Command("sh", "-c", "exit 5")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Wait()
	p := &workerProc{pidNum: cmd.Process.Pid, exited: make(chan struct{})}
	deadline := time.Now().Add(5 * time.Second)
	for procState(p.pidNum) != "Z" {
		if time.Now().After(deadline) {
			t.Fatal("the child never became a zombie")
		}
		time.Sleep(5 * time.Millisecond)
	}
	p.exitEarly()
	select {
	case <-p.exited:
	default:
		t.Fatal("exitEarly did not record the zombie's exit")
	}
	if !p.early || p.exit.code != 5 {
		t.Errorf("exit %+v early %t, want code 5, early", p.exit, p.early)
	}

	reaped := &workerProc{pidNum: cmd.Process.Pid, exited: make(chan struct{})}
	reaped.reaped.Store(true)
	reaped.exitEarly()
	select {
	case <-reaped.exited:
		t.Error("exitEarly recorded an exit after wait4 reaped the worker")
	default:
	}
}

// A running process's threads are not all exiting; a zombie's are.
func TestAllThreadsExiting(t *testing.T) {
	if allThreadsExiting(unix.Getpid()) {
		t.Error("this test process's threads read as exiting")
	}
	if allThreadsExiting(-1) {
		t.Error("a missing process reads as exiting")
	}
	if !threadExiting(statFields("R", 0x404, 0)) || threadExiting(statFields("S", 0x400, 0)) || !threadExiting(statFields("Z", 0, 0)) {
		t.Error("threadExiting misreads the state and PF_EXITING")
	}
}
