package integration

import (
	"fmt"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

var (
	gen0PID   = regexp.MustCompile(`(?m)^\[rank (\d+)\] rank \d+ generation 0 pid (\d+)$`)
	restarted = regexp.MustCompile(`(?m)^\[rank (\d+)\] RESTART rank=\d+ generation=(\d+) pid=(\d+) survivor=(true|false) recovered_in=[0-9.]+$`)
	doneLine  = regexp.MustCompile(`(?m)^\[rank (\d+)\] rank \d+ done steps=20 value=(\S+)$`)
	envLine   = regexp.MustCompile(`(?m)^\[rank (\d+)\] ENV rank=\d+ (.*)$`)
	deathLine = regexp.MustCompile(`(?m)^\[rank \d+\] .*dies on purpose`)
)

// TestInProcessRecovery: rank 1 of three dies; ranks 0 and 2 run worker.Run
// and recover in process (same pids), only rank 1's process is started
// again, it restores the survivors' state by broadcast, and every rank ends
// with the same value.
func TestInProcessRecovery(t *testing.T) {
	t.Parallel()
	r := launch(t, time.Minute, "launch", "--nproc-per-node", "3", "--backend", "cpu", "--max-restarts", "1", "--grace-period", "3s",
		"--", bin.testprog, "restart", "--inprocess", "--mark", filepath.Join(t.TempDir(), "mark"))
	if r.code != 0 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
	}
	pids := map[string]string{}
	for _, m := range gen0PID.FindAllStringSubmatch(r.stdout, -1) {
		pids[m[1]] = m[2]
	}
	restarts := restarted.FindAllStringSubmatch(r.stdout, -1)
	if len(pids) != 3 || len(restarts) != 3 {
		t.Fatalf("want 3 ranks in generation 0 and 3 in generation 1:\n%s", r.stdout)
	}
	for _, m := range restarts {
		rank, gen, pid, survivor := m[1], m[2], m[3], m[4]
		wantSurvivor := rank != "1"
		if gen != "1" || (survivor == "true") != wantSurvivor || (pid == pids[rank]) != wantSurvivor {
			t.Errorf("rank %s: generation %s pid %s (was %s) survivor=%s; want generation 1, survivor=%t with the same pid",
				rank, gen, pid, pids[rank], survivor, wantSurvivor)
		}
	}
	for rank := range 3 {
		if want := fmt.Sprintf("[rank %d] rank %d generation 1 source 0 restored step 5\n", rank, rank); !strings.Contains(r.stdout, want) {
			t.Errorf("stdout lacks %q", want)
		}
	}
	done := doneLine.FindAllStringSubmatch(r.stdout, -1)
	if len(done) != 3 || done[0][2] != done[1][2] || done[1][2] != done[2][2] {
		t.Errorf("ranks end with different values or not at all: %q\n%s", done, r.stdout)
	}
	// The rank's own line; the restart line quotes it once more.
	if n := len(deathLine.FindAllString(r.stdout+r.stderr, -1)); n != 1 {
		t.Errorf("%d deaths, want 1", n)
	}
	// The survivors' environment is the new generation's, as the new
	// process's is (it was the old one's: GOTRAIN_GENERATION=0).
	checkGeneration1Env(t, r.stdout, 3)
}

// checkGeneration1Env checks the ENV lines of testprog restart: each of n
// ranks sees generation 1's variables, the same as every other rank,
// whether its process survived, came from a standby or was started anew.
func checkGeneration1Env(t *testing.T, stdout string, n int) {
	t.Helper()
	envs := envLine.FindAllStringSubmatch(stdout, -1)
	if len(envs) != n {
		t.Fatalf("want an ENV line from each of %d ranks:\n%s", n, stdout)
	}
	for _, m := range envs {
		if m[2] != envs[0][2] || !strings.Contains(m[2], "GOTRAIN_GENERATION=1 GOTRAIN_RESTART_COUNT=1 ") ||
			!strings.Contains(m[2], "TORCHELASTIC_RESTART_COUNT=1 ") || !strings.HasSuffix(m[2], "GOTRAIN_STANDBY=") {
			t.Errorf("rank %s's environment in generation 1: %s; want generation 1's, the same as every rank's (%s)", m[1], m[2], envs[0][2])
		}
	}
}
