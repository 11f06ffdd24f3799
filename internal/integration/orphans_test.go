package integration

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// startSleepers launches n workers that record their pids (and their
// children's) in a directory, and waits until all have.
func startSleepers(t *testing.T, n int, ignoreTerm bool) (cmd *exec.Cmd, workers, all []int, stderr *strings.Builder) {
	t.Helper()
	dir := t.TempDir()
	args := []string{"launch", "--nproc-per-node", strconv.Itoa(n), "--backend", "cpu", "--grace-period", "1s",
		"--", bin.testprog, "sleep", "--pid-dir", dir}
	if ignoreTerm {
		args = append(args, "--ignore-term")
	}
	cmd = exec.Command(bin.gotrain, args...)
	stderr = &strings.Builder{}
	cmd.Stderr = stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	deadline := time.Now().Add(30 * time.Second)
	for {
		files, _ := filepath.Glob(filepath.Join(dir, "*.pid"))
		if len(files) == 2*n {
			for _, f := range files {
				b, err := os.ReadFile(f)
				if err != nil {
					t.Fatal(err)
				}
				pid, err := strconv.Atoi(string(b))
				if err != nil {
					t.Fatal(err)
				}
				all = append(all, pid)
				if strings.HasPrefix(filepath.Base(f), "worker-") {
					workers = append(workers, pid)
				}
			}
			return cmd, workers, all, stderr
		}
		if time.Now().After(deadline) {
			t.Fatalf("workers did not start: %d pid files\nstderr:\n%s", len(files), stderr.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// alive reports whether pid is a live process (zombies count as dead: they
// have exited and only wait for their parent to reap them).
func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] != 'Z'
}

// waitGone fails the test unless every pid is gone within d.
func waitGone(t *testing.T, pids []int, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		var left []int
		for _, p := range pids {
			if alive(p) {
				left = append(left, p)
			}
		}
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			for _, p := range left {
				_ = syscall.Kill(p, syscall.SIGKILL)
			}
			t.Fatalf("processes still running %s later: %v", d, left)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestSIGTERMToAgentLeavesNoProcess(t *testing.T) {
	cmd, _, pids, stderr := startSleepers(t, 3, false)
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	err := cmd.Wait()
	if code := cmd.ProcessState.ExitCode(); code != 128+int(syscall.SIGTERM) {
		t.Errorf("agent exit %d (%v), want %d\nstderr:\n%s", code, err, 128+int(syscall.SIGTERM), stderr)
	}
	// Everything is gone by the time the agent has exited.
	waitGone(t, pids, 0)
}

func TestSIGKILLToAgentLeavesNoProcess(t *testing.T) {
	cmd, workers, all, _ := startSleepers(t, 3, false)
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	// Workers die through PR_SET_PDEATHSIG; the processes they started die
	// when the agent's reaper sees the agent's pipe close.
	waitGone(t, workers, 10*time.Second)
	waitGone(t, all, 10*time.Second)
}

func TestWorkerIgnoringSIGTERMIsKilledAfterGrace(t *testing.T) {
	cmd, _, pids, stderr := startSleepers(t, 2, true)
	start := time.Now()
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	if took := time.Since(start); took < time.Second {
		t.Errorf("agent exited after %s, before the 1s grace period", took)
	}
	if !strings.Contains(stderr.String(), "SIGTERM received") {
		t.Errorf("agent did not say it was stopping:\n%s", stderr)
	}
	waitGone(t, pids, 0)
}
