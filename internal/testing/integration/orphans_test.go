package integration

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gotrain/gotrain/internal/testing/testkit"
)

// startSleepers launches n workers that record their pids (and their
// children's) in a directory, and waits until all have.
func startSleepers(t *testing.T, n int, ignoreTerm bool) (cmd *exec.Cmd, workers, all []int, stderr *testkit.Buffer) {
	t.Helper()
	dir := t.TempDir()
	args := []string{"launch", "--nproc-per-node", strconv.Itoa(n), "--backend", "cpu", "--grace-period", "1s",
		"--", bin.testprog, "sleep", "--pid-dir", dir}
	if ignoreTerm {
		args = append(args, "--ignore-term")
	}
	cmd = gotrainCmd(context.Background(), t, nil, args...)
	stderr = &testkit.Buffer{}
	cmd.Stderr = stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	var files []string
	testkit.WaitFor(t, time.Minute, fmt.Sprintf("%d pid files (%d workers and their children)", 2*n, n), func() bool {
		files, _ = filepath.Glob(filepath.Join(dir, "*.pid"))
		return len(files) == 2*n
	})
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

// waitGone fails the test unless every pid is gone within d (SIGKILLing
// those left).
func waitGone(t *testing.T, pids []int, d time.Duration) {
	t.Helper()
	var left []int
	defer func() {
		if len(left) > 0 { // waitUntil failed the test
			t.Logf("processes still running %s later: %v", d, left)
			for _, p := range left {
				_ = syscall.Kill(p, syscall.SIGKILL)
			}
		}
	}()
	testkit.WaitFor(t, d, fmt.Sprintf("processes %v to be gone", pids), func() bool {
		left = left[:0]
		for _, p := range pids {
			if alive(p) {
				left = append(left, p)
			}
		}
		return len(left) == 0
	})
}

func TestSIGTERMToAgentLeavesNoProcess(t *testing.T) {
	t.Parallel()
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
	t.Parallel()
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
	t.Parallel()
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

// A worker's grandchild that leaves the worker's session (setsid) and its
// process group is still the job's: gotrain must not leave it behind, when
// the job succeeds nor when gotrain itself is SIGKILLed. The grandchild's
// `sleep 300.<unique>` marks it in /proc.
func TestGrandchildThatLeftTheSessionIsStopped(t *testing.T) {
	t.Parallel()
	for i, how := range []string{"job succeeds", "gotrain SIGKILLed"} {
		t.Run(how, func(t *testing.T) {
			t.Parallel()
			// sleep takes a fraction: 300.<pid><i> is unique to this run.
			marker := fmt.Sprintf("300.%d%d", os.Getpid(), i)
			t.Cleanup(func() { // a failed run leaves no 5-minute sleep behind
				for _, pid := range sleepers(marker) {
					_ = syscall.Kill(pid, syscall.SIGKILL)
				}
			})
			worker := "setsid sleep " + marker + " & sleep 1"
			if how == "gotrain SIGKILLed" {
				worker = "setsid sleep " + marker + " & sleep 300"
			}
			cmd := gotrainCmd(context.Background(), t, nil, "launch", "--nproc-per-node", "1", "--backend", "cpu",
				"--grace-period", "1s", "--", "sh", "-c", worker)
			stderr := &testkit.Buffer{}
			cmd.Stderr = stderr
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
			testkit.WaitFor(t, time.Minute, "the worker's grandchild sleep "+marker, func() bool { return len(sleepers(marker)) > 0 })
			if how == "gotrain SIGKILLed" {
				// The agent tells its reaper about a process that left its
				// worker's group at its next scan of /proc (within 0.5 s:
				// internal/launcher/supervise's ScanPeriod; sooner after a start).
				// One that escapes less than that before a SIGKILL is the
				// documented gap, not what this test is about.
				time.Sleep(time.Second)
				if err := cmd.Process.Kill(); err != nil {
					t.Fatal(err)
				}
				_ = cmd.Wait()
			} else if err := cmd.Wait(); err != nil {
				t.Fatalf("gotrain: %v\nstderr:\n%s", err, stderr.String())
			}
			// Gone by the time gotrain has exited, or soon after (a
			// SIGKILLed agent's reaper needs a moment).
			testkit.WaitFor(t, 10*time.Second, "no sleep "+marker+" left", func() bool { return len(sleepers(marker)) == 0 })
		})
	}
}

// sleepers returns the pids of live `sleep ARG` processes.
func sleepers(arg string) []int {
	var out []int
	for _, p := range processes() {
		if len(p.argv) == 2 && filepath.Base(p.argv0) == "sleep" && p.argv[1] == arg {
			out = append(out, p.pid)
		}
	}
	return out
}
