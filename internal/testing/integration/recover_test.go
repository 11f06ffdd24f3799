package integration

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
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

// TestInProcessRecoveryShrink: the job's first node (ranks 0-1) is lost;
// the job shrinks (--nnodes 1:2) onto the second, whose ranks 2 and 3 run
// worker.Run and recover in process as ranks 0 and 1 of the next
// generation. From then on each survivor's output is its new rank's: the
// former rank 2 prints under "[rank 0]" and writes to rank0.log, and its
// rank2.log ends where it became rank 0.
func TestInProcessRecoveryShrink(t *testing.T) {
	t.Parallel()
	mark := filepath.Join(t.TempDir(), "mark")
	logDir := t.TempDir()
	coord := startJob(t, "coordinator", "--nnodes", "1:2", "--listen", "127.0.0.1:0", "--max-restarts", "1")
	join := joinArgs(t, coord)
	flags := []string{"--nnodes", "1:2", "--max-restarts", "1", "--grace-period", "3s"}
	program := []string{"--", bin.testprog, "restart", "--inprocess", "--victim", "0", "--await-kill", "--mark", mark}
	first := startAgent(t, slices.Concat(flags, join, program)...)
	waitOutput(t, coord, "the first node's join", func() bool { return strings.Contains(coord.err.String(), "node_id=node-1") })
	second := startAgent(t, slices.Concat(flags, join, []string{"--log-dir", logDir}, program)...)

	// Rank 0 (on the first node) waits to be killed once generation 0 did
	// its steps; the second node's ranks are 2 and 3.
	waitOutput(t, first, "rank 0's victim line", func() bool { return victimLine.MatchString(first.out.String()) })
	pids := map[string]string{}
	for _, m := range gen0PID.FindAllStringSubmatch(second.out.String(), -1) {
		pids[m[1]] = m[2]
	}
	if len(pids) != 2 || pids["2"] == "" || pids["3"] == "" {
		t.Fatalf("the second node's generation 0 ranks %v, want 2 and 3\n%s", pids, dump(coord, first, second))
	}
	if err := os.WriteFile(mark, []byte(strconv.FormatInt(time.Now().UnixNano(), 10)), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := first.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if code := second.wait(t, time.Minute); code != 0 {
		t.Fatalf("the second agent exited %d\n%s", code, dump(coord, first, second))
	}
	out := second.out.String()
	restarts := restarted.FindAllStringSubmatch(out, -1)
	if len(restarts) != 2 {
		t.Fatalf("want 2 ranks in the shrunk generation:\n%s", dump(coord, second))
	}
	for _, m := range restarts {
		// The RESTART line's prefix is the agent's; its rank= the worker's own.
		prefix, pid, survivor := m[1], m[3], m[4]
		former := map[string]string{"0": "2", "1": "3"}[prefix]
		if survivor != "true" || pid != pids[former] {
			t.Errorf("[rank %s]: pid %s survivor=%s; want the former rank %s (pid %s), a survivor", prefix, pid, survivor, former, pids[former])
		}
		if !strings.Contains(m[0], "RESTART rank="+prefix+" ") {
			t.Errorf("the agent prints rank %s's line under another rank's prefix: %q", prefix, m[0])
		}
	}
	done := doneLine.FindAllStringSubmatch(out, -1)
	if len(done) != 2 || done[0][2] != done[1][2] {
		t.Errorf("the ranks end with different values or not at all: %q\n%s", done, out)
	}

	// The log files: rank0.log holds the former rank 2's lines as rank 0,
	// rank2.log its lines as rank 2 and where it ended.
	i := strings.Index(second.err.String(), "gotrain: logs in ")
	if i < 0 {
		t.Fatalf("no log dir line:\n%s", second.err.String())
	}
	runDir := strings.TrimSpace(strings.SplitN(second.err.String()[i+len("gotrain: logs in "):], "\n", 2)[0])
	read := func(name string) string {
		b, err := os.ReadFile(filepath.Join(runDir, name))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	rank0, rank2 := read("rank0.log"), read("rank2.log")
	if want := "RESTART rank=0 generation=1 pid=" + pids["2"] + " survivor=true"; !strings.Contains(rank0, want) {
		t.Errorf("rank0.log lacks %q:\n%s", want, rank0)
	}
	if !strings.Contains(rank0, "rank 0 done steps=20") {
		t.Errorf("rank0.log lacks rank 0's last line:\n%s", rank0)
	}
	if want := "rank 2 generation 0 pid " + pids["2"]; !strings.Contains(rank2, want) {
		t.Errorf("rank2.log lacks %q:\n%s", want, rank2)
	}
	if strings.Contains(rank2, "RESTART") || !strings.Contains(rank2, "=== gotrain: rank 2 continues as rank 0") {
		t.Errorf("rank2.log holds lines of the later rank 0, or does not say where it ended:\n%s", rank2)
	}
	if code := coord.wait(t, 30*time.Second); code != 0 {
		t.Errorf("the coordinator exited %d\n%s", code, coord.err.String())
	}
}
