package integration

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gotrain/gotrain/internal/testing/testkit"
)

var (
	standbyLine  = regexp.MustCompile(`(?m)^\[standby (\d+)\] standby pid=(\d+) slot=(\d+) unix_ns=(\d+)$`)
	standbyReady = regexp.MustCompile(`msg="standby ready".* slot=(\d+) pid=(\d+)`)
	victimLine   = regexp.MustCompile(`(?m)^\[rank (\d+)\] victim rank=\d+ pid=(\d+)$`)
	plainLine    = regexp.MustCompile(`(?m)^\[rank (\d+)\] plain rank=\d+ restart=(\d+) pid=(\d+)$`)
)

// job is a `gotrain launch` running in the background.
type job struct {
	cmd      *exec.Cmd
	out, err testkit.Buffer
	done     chan struct{}
}

func startJob(t *testing.T, args ...string) *job {
	t.Helper()
	j := &job{cmd: gotrainCmd(context.Background(), t, nil, args...), done: make(chan struct{})}
	j.cmd.Stdout, j.cmd.Stderr = &j.out, &j.err
	if err := j.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = j.cmd.Wait(); close(j.done) }()
	t.Cleanup(func() { _ = j.cmd.Process.Kill(); <-j.done })
	return j
}

// wait waits for the job's exit status.
func (j *job) wait(t *testing.T, d time.Duration) int {
	t.Helper()
	select {
	case <-j.done:
		return j.cmd.ProcessState.ExitCode()
	case <-time.After(d):
		t.Fatalf("the job did not end within %s\nstdout:\n%s\nstderr:\n%s", d, j.out.String(), j.err.String())
		return -1
	}
}

// readyStandbys returns the pids of the standbys the agent logged ready, by
// slot (the latest per slot).
func readyStandbys(stderr string) map[string]string {
	out := map[string]string{}
	for _, m := range standbyReady.FindAllStringSubmatch(stderr, -1) {
		out[m[1]] = m[2]
	}
	return out
}

// killVictim writes the time of death to mark, as testprog's victim would,
// then SIGKILLs it.
func killVictim(t *testing.T, mark string, pid int) time.Time {
	t.Helper()
	now := time.Now()
	if err := os.WriteFile(mark+".tmp", []byte(strconv.FormatInt(now.UnixNano(), 10)), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(mark+".tmp", mark); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	return now
}

// TestStandbyTakesOverKilledRanks: with --standby, after rank 1 is
// SIGKILLed mid-job, every rank of the next generation is a standby that was
// running before the kill (same pid), printing as its rank and into its log
// file; the job finishes and leaves no process.
func TestStandbyTakesOverKilledRanks(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	mark := filepath.Join(dir, "mark")
	logs := filepath.Join(dir, "logs")
	j := startJob(t, "launch", "--verbose", "--standby", "--nproc-per-node", "2", "--backend", "cpu", "--max-restarts", "1",
		"--grace-period", "3s", "--log-dir", logs, "--", bin.testprog, "restart", "--mark", mark, "--await-kill")
	var victim int
	testkit.WaitFor(t, time.Minute, "the victim and two ready standbys", func() bool {
		m := victimLine.FindStringSubmatch(j.out.String())
		if m != nil {
			victim, _ = strconv.Atoi(m[2])
		}
		return m != nil && len(readyStandbys(j.err.String())) == 2
	})
	ready := readyStandbys(j.err.String())
	death := killVictim(t, mark, victim)
	if code := j.wait(t, time.Minute); code != 0 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, j.out.String(), j.err.String())
	}
	out := j.out.String()
	started := map[string]int64{} // standby pid -> when its main ran
	for _, m := range standbyLine.FindAllStringSubmatch(out, -1) {
		ns, _ := strconv.ParseInt(m[4], 10, 64)
		started[m[2]] = ns
	}
	restarts := restarted.FindAllStringSubmatch(out, -1)
	if len(restarts) != 2 {
		t.Fatalf("want 2 ranks back in generation 1:\n%s", out)
	}
	for _, m := range restarts {
		rank, gen, pid := m[1], m[2], m[3]
		if gen != "1" || pid != ready[rank] {
			t.Errorf("rank %s: generation %s pid %s; want generation 1 in slot %s's standby, pid %s", rank, gen, pid, rank, ready[rank])
		}
		if ns, ok := started[pid]; !ok || ns >= death.UnixNano() {
			t.Errorf("rank %s's process %s did not run as a standby before the kill", rank, pid)
		}
	}
	if n := strings.Count(j.err.String(), `msg="worker started from standby"`); n != 2 {
		t.Errorf("%d ranks started from standbys, want 2", n)
	}
	checkGeneration1Env(t, out, 2)
	b, err := os.ReadFile(filepath.Join(runLogDir(t, logs), "rank1.log"))
	if err != nil {
		t.Fatal(err)
	}
	if want := "generation 1, started "; !strings.Contains(string(b), want) ||
		!strings.Contains(string(b), fmt.Sprintf("(standby pid %s)\nstandby pid=%s slot=1 ", ready["1"], ready["1"])) ||
		!strings.Contains(string(b), "RESTART rank=1 generation=1 pid="+ready["1"]) {
		t.Errorf("rank1.log lacks the standby's generation:\n%s", b)
	}
	waitNoLeftovers(t, 5*time.Second, j.cmd.Process.Pid)
}

// TestStandbyInProcessRecovery: survivors recover in process (same pids),
// the killed rank's place goes to its slot's standby, every rank ends with
// the same state, and only that slot gets a new standby.
func TestStandbyInProcessRecovery(t *testing.T) {
	t.Parallel()
	mark := filepath.Join(t.TempDir(), "mark")
	j := startJob(t, "launch", "--verbose", "--standby", "--nproc-per-node", "3", "--backend", "cpu", "--max-restarts", "1",
		"--grace-period", "3s", "--", bin.testprog, "restart", "--inprocess", "--mark", mark, "--await-kill")
	var victim int
	testkit.WaitFor(t, time.Minute, "the victim and three ready standbys", func() bool {
		m := victimLine.FindStringSubmatch(j.out.String())
		if m != nil {
			victim, _ = strconv.Atoi(m[2])
		}
		return m != nil && len(readyStandbys(j.err.String())) == 3
	})
	ready := readyStandbys(j.err.String())
	killVictim(t, mark, victim)
	if code := j.wait(t, time.Minute); code != 0 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, j.out.String(), j.err.String())
	}
	out := j.out.String()
	gen0 := map[string]string{}
	for _, m := range gen0PID.FindAllStringSubmatch(out, -1) {
		gen0[m[1]] = m[2]
	}
	restarts := restarted.FindAllStringSubmatch(out, -1)
	if len(gen0) != 3 || len(restarts) != 3 {
		t.Fatalf("want 3 ranks in generation 0 and 3 in generation 1:\n%s", out)
	}
	for _, m := range restarts {
		rank, pid, survivor := m[1], m[3], m[4]
		want := gen0[rank]
		if rank == "1" {
			want = ready["1"]
		}
		if pid != want || (survivor == "true") != (rank != "1") {
			t.Errorf("rank %s: pid %s survivor=%s; want pid %s", rank, pid, survivor, want)
		}
	}
	done := doneLine.FindAllStringSubmatch(out, -1)
	if len(done) != 3 || done[0][2] != done[1][2] || done[1][2] != done[2][2] {
		t.Errorf("ranks end with different values or not at all: %q\n%s", done, out)
	}
	if n := strings.Count(j.err.String(), `msg="standby started"`); n != 4 {
		t.Errorf("%d standbys started, want 4 (3, then 1 for the used slot)\n%s", n, j.err.String())
	}
	checkGeneration1Env(t, out, 3) // two survivors and a standby alike
	waitNoLeftovers(t, 5*time.Second, j.cmd.Process.Pid)
}

// TestStandbyFallsBackForProgramsWithoutWorkerLibrary: a program that never
// attaches as a standby gets one warning, its standbys are killed, and
// restarted ranks are new processes as without --standby.
func TestStandbyFallsBackForProgramsWithoutWorkerLibrary(t *testing.T) {
	t.Parallel()
	goFile := filepath.Join(t.TempDir(), "go")
	j := startJob(t, "launch", "--standby", "--standby-timeout", "3s", "--nproc-per-node", "2", "--backend", "cpu",
		"--max-restarts", "1", "--grace-period", "3s", "--", bin.testprog, "plain", "--go", goFile)
	const warning = "gotrain: warning: --standby is off: "
	testkit.WaitFor(t, time.Minute, "the warning", func() bool { return strings.Contains(j.err.String(), warning) })
	if err := os.WriteFile(goFile, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if code := j.wait(t, time.Minute); code != 0 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, j.out.String(), j.err.String())
	}
	out, errs := j.out.String(), j.err.String()
	if n := strings.Count(errs, warning); n != 1 || !strings.Contains(errs, "worker library") {
		t.Errorf("%d warnings, want 1 naming the worker library:\n%s", n, errs)
	}
	standbys := map[string]bool{}
	for _, m := range standbyLine.FindAllStringSubmatch(out, -1) {
		standbys[m[2]] = true
	}
	if len(standbys) == 0 {
		t.Errorf("no standby ran:\n%s", out)
	}
	var gen1 int
	for _, m := range plainLine.FindAllStringSubmatch(out, -1) {
		if m[2] == "1" {
			gen1++
			if standbys[m[3]] {
				t.Errorf("rank %s of the restart is standby pid %s", m[1], m[3])
			}
		}
	}
	if gen1 != 2 {
		t.Errorf("%d ranks ran the restart, want 2:\n%s", gen1, out)
	}
	waitNoLeftovers(t, 5*time.Second, j.cmd.Process.Pid)
}

// TestStandbyProgramThatEndsAtOnce: standbys of a program that ignores them
// and exits never disturb the job's ranks or their environment.
func TestStandbyProgramThatEndsAtOnce(t *testing.T) {
	t.Parallel()
	j := startJob(t, "launch", "--standby", "--nproc-per-node", "2", "--backend", "cpu", "--", bin.testprog, "env")
	if code := j.wait(t, time.Minute); code != 0 {
		t.Fatalf("exit %d\nstderr:\n%s", code, j.err.String())
	}
	out := j.out.String()
	for rank := range 2 {
		if !strings.Contains(out, fmt.Sprintf("[rank %d] GOTRAIN_RANK=%d\n", rank, rank)) {
			t.Errorf("rank %d's environment is missing:\n%s", rank, out)
		}
	}
	if strings.Contains(out, "GOTRAIN_STANDBY") && regexp.MustCompile(`(?m)^\[rank \d+\] GOTRAIN_STANDBY`).MatchString(out) {
		t.Errorf("a rank sees standby variables:\n%s", out)
	}
	if regexp.MustCompile(`(?m)^\[standby \d+\] (GOTRAIN_)?RANK=`).MatchString(out) {
		t.Errorf("a standby has a rank:\n%s", out)
	}
	waitNoLeftovers(t, 5*time.Second, j.cmd.Process.Pid)
}
