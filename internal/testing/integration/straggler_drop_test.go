package integration

import (
	"fmt"
	"os"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gotrain/gotrain/internal/testing/testkit"
)

// --on-straggler replace end to end, the two paths the machine tests cover
// alone: under --nnodes MIN:MAX with more than MIN nodes the straggler's
// node is dropped (real agents over loopback), and on a single node with
// --standby on the replaced rank goes to a ready standby. The checks are on
// what happened (which lines, which processes, which generation), never on
// how fast: the waits are minutes, for a loaded 2-vCPU machine with the
// whole suite running at once.

// dropWait bounds every wait of these tests: the verdict needs about 15 s of
// slow steps and --straggler-persist 5 s more; the rest is room for a
// loaded machine.
const dropWait = 3 * time.Minute

// waitJobs waits up to d until cond holds, failing with every job's output
// if it does not (or if one of must exits first).
func waitJobs(t *testing.T, d time.Duration, what string, all []*job, must []*job, cond func() bool) {
	t.Helper()
	ok := false
	defer func() {
		if !ok {
			t.Logf("waiting for %s:\n%s", what, dump(all...))
		}
	}()
	testkit.WaitFor(t, d, what, func() bool {
		if cond() {
			ok = true
			return true
		}
		for _, j := range must {
			select {
			case <-j.done:
				t.Fatalf("process %v exited (%v) before %s", j.cmd.Args[1:3], j.cmd.ProcessState, what)
			default:
			}
		}
		return false
	})
}

// genSteps returns, by rank, the highest seq of the STEP lines of
// generation gen in outs.
func genSteps(gen int, outs ...string) map[int]int {
	re := regexp.MustCompile(`(?m)^\[rank \d+\] STEP rank (\d+) gen ` + strconv.Itoa(gen) + ` seq (\d+) `)
	got := map[int]int{}
	for _, out := range outs {
		for _, m := range re.FindAllStringSubmatch(out, -1) {
			r, _ := strconv.Atoi(m[1])
			s, _ := strconv.Atoi(m[2])
			got[r] = max(got[r], s)
		}
	}
	return got
}

func keys(m map[int]int) []int {
	var out []int
	for k := range m {
		out = append(out, k)
	}
	sort.Ints(out)
	return out
}

// TestStragglerNodeDropped: three agents of 2 CPU ranks each under
// --nnodes 2:3; rank 5, on the last node to join (not the coordinator's,
// which the first agent embeds), is three times slower than the others in
// every generation. Its node is dropped: its agent stops its workers and
// exits non-zero naming the rank, the host and why; the others go on in a
// new generation of 4 ranks (the dropped node's ranks gone, steps
// advancing) without counting a restart (--max-restarts 0). Should the
// third agent join after the job started on two, the job grows first and
// rank 5 turns slow in the grown generation: the checks hold either way.
func TestStragglerNodeDropped(t *testing.T) {
	t.Parallel()
	host, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	flags := []string{"--nnodes", "2:3", "--max-restarts", "0", "--grace-period", "1s",
		"--on-straggler", "replace", "--straggler-persist", "5s"}
	program := []string{"--", bin.testprog, "hang", "--fault", "none", "--steps", "100000", "--step-time", "200ms", "--jitter", "50ms",
		"--slow-rank", "5", "--slow-from", "10", "--slow-step-time", "600ms", "--step-lines"}
	// A long settle: the job starts once the three have joined, not on two.
	first := startAgent(t, slices.Concat(flags, []string{"--coordinator-listen", "127.0.0.1:0", "--join-settle", "30s"}, program)...)
	join := joinArgs(t, first)
	others := []*job{startAgent(t, slices.Concat(flags, join, program)...), startAgent(t, slices.Concat(flags, join, program)...)}
	all := append([]*job{first}, others...)

	// The node of rank 5 is whichever of the two joined last.
	var dropped, kept *job
	waitJobs(t, dropWait, "rank 5 to turn slow", all, all, func() bool {
		for i, j := range others {
			if strings.Contains(j.out.String(), "[rank 5] SLOW rank 5 seq 10 ") {
				dropped, kept = j, others[1-i]
				return true
			}
		}
		return false
	})
	// Its workers (ranks 4 and 5), to check that none is left.
	var workers []int
	waitJobs(t, dropWait, "the dropped node's 2 workers", all, all, func() bool {
		workers = descendants(dropped.cmd.Process.Pid, bin.testprog)
		return len(workers) == 2
	})

	code := dropped.wait(t, dropWait)
	if code == 0 {
		t.Errorf("the dropped agent exited 0")
	}
	q := regexp.QuoteMeta
	left := regexp.MustCompile(`(?m)^gotrain: this node \(` + q(host) + `\) left the job: rank 5 on host ` + q(host) +
		` dropped as a persistent straggler \(the straggler for \d+s, --on-straggler replace\): rank 5 on host ` + q(host) +
		` is the straggler: .*; the job goes on on its other 2 nodes \(--nnodes 2:3\); its workers were stopped$`)
	if !left.MatchString(dropped.err.String()) {
		t.Errorf("the dropped agent (exit %d) does not say it left the job as the straggler's node:\n%s", code, dropped.err.String())
	}
	if s := dropped.err.String(); strings.Contains(s, "lost the coordinator") || strings.Contains(s, "job failed") {
		t.Errorf("the dropped agent reports a lost coordinator or a failed job:\n%s", s)
	}
	t.Logf("the dropped agent exited %d: %s", code, left.FindString(dropped.err.String()))
	waitGone(t, workers, 30*time.Second)

	// The others: the generation ended on the dropped node, named with its
	// agent and ranks; the next one runs on ranks 0-3 and its steps advance.
	ended := regexp.MustCompile(`(?m)^gotrain: generation (\d+) ended: node node-\d+ on ` + q(host) + ` \(127\.0\.0\.1, agent pid ` +
		strconv.Itoa(dropped.cmd.Process.Pid) + `; ranks 4-5\) was lost: straggler: rank 5 on host ` + q(host) + ` dropped as a persistent straggler`)
	var gen int
	waitJobs(t, dropWait, "the others' line for the dropped node", all, []*job{first, kept}, func() bool {
		m1, m2 := ended.FindStringSubmatch(first.err.String()), ended.FindStringSubmatch(kept.err.String())
		if m1 == nil || m2 == nil {
			return false
		}
		if m1[1] != m2[1] {
			t.Fatalf("the agents ended different generations: %s and %s", m1[0], m2[0])
		}
		gen, _ = strconv.Atoi(m1[1])
		return true
	})
	next := gen + 1
	t.Logf("generation %d ended on the dropped node; generation %d runs on the others", gen, next)
	waitJobs(t, dropWait, fmt.Sprintf("20 steps of generation %d on ranks 0-3", next), all, []*job{first, kept}, func() bool {
		steps := genSteps(next, first.out.String(), kept.out.String())
		for r := range 4 {
			if steps[r] < 20 {
				return false
			}
		}
		return true
	})
	if ranks := keys(genSteps(next, first.out.String(), kept.out.String(), dropped.out.String())); !slices.Equal(ranks, []int{0, 1, 2, 3}) {
		t.Errorf("generation %d ran ranks %v, want 0-3 (world size 4)", next, ranks)
	}
	if ranks := keys(genSteps(next, first.out.String())); !slices.Equal(ranks, []int{0, 1}) {
		t.Errorf("the first node ran ranks %v of generation %d, want 0-1", ranks, next)
	}
	if steps := genSteps(next, dropped.out.String()); len(steps) != 0 {
		t.Errorf("the dropped node ran generation %d: %v", next, steps)
	}
	for i, j := range []*job{first, kept} {
		select {
		case <-j.done:
			t.Errorf("surviving agent %d exited (%v)", i, j.cmd.ProcessState)
		default:
		}
		for _, bad := range []string{"job failed", "restarting", "generation " + strconv.Itoa(next) + " ended"} {
			if strings.Contains(j.err.String(), bad) {
				t.Errorf("surviving agent %d's stderr has %q", i, bad)
			}
		}
	}

	// The job is stopped; nothing of any node is left.
	for _, j := range []*job{first, kept} {
		_ = j.cmd.Process.Signal(syscall.SIGTERM)
	}
	exits(t, time.Minute, first, kept)
	if t.Failed() {
		t.Log(dump(all...))
	}
	waitNoLeftovers(t, 30*time.Second)
}

// standbyStarted is the agent's --verbose line for a rank handed to a
// standby.
var standbyStarted = regexp.MustCompile(`msg="worker started from standby" .*\brank=(\d+) slot=(\d+) pid=(\d+) generation=(\d+)`)

// TestStragglerReplacedByStandby: on one node with --standby on, rank 2 is
// three times slower in generation 0; it is replaced, and generation 1's
// rank 2 is the standby of slot 2 that was ready before the replacement
// (the agent's "worker started from standby" line names its pid), not a
// new process; the old rank 2 is gone, the new one runs at full speed and
// the job goes on without counting a restart.
func TestStragglerReplacedByStandby(t *testing.T) {
	t.Parallel()
	r := startLaunch(t, t.TempDir(), stragglerArgs("--on-straggler", "replace", "--standby", "on", "--verbose")...)
	r.waitFor(t, replacedLine, dropWait)
	// Rank 2 of generation 1 steps on.
	step := regexp.MustCompile(`^\[rank 2\] STEP rank 2 gen 1 seq (\d+) `)
	deadline := time.Now().Add(dropWait)
	for {
		m := step.FindStringSubmatch(r.waitFor(t, step, time.Until(deadline)).text)
		if n, _ := strconv.Atoi(m[1]); n >= 20 {
			break
		}
	}
	log := r.log.String()
	fail := func(format string, args ...any) {
		t.Helper()
		t.Fatalf(format+"\noutput:\n%s", append(args, log)...)
	}
	at := regexp.MustCompile(`(?m)^gotrain: generation 0 ended: replacing rank 2 `).FindStringIndex(log)
	if at == nil {
		fail("no replacement line")
	}
	before, after := log[:at[0]], log[at[0]:]
	// The standby of slot 2 that was ready when rank 2 was replaced.
	var standby string
	for _, m := range standbyReady.FindAllStringSubmatch(before, -1) {
		if m[1] == "2" {
			standby = m[2]
		}
	}
	if standby == "" {
		fail("no standby of slot 2 was ready before the replacement")
	}
	old := regexp.MustCompile(`(?m)^gotrain:   rank 2 \(pid (\d+) on `).FindStringSubmatch(before)
	if old == nil {
		fail("the verdict does not name rank 2's pid")
	}
	var took []string
	for _, m := range standbyStarted.FindAllStringSubmatch(after, -1) {
		if m[1] == "2" {
			took = m
		}
	}
	if took == nil || took[2] != "2" || took[3] != standby || took[4] != "1" {
		fail("rank 2 of generation 1 is not the ready standby of slot 2 (pid %s): %q", standby, took)
	}
	if old[1] == standby {
		fail("the standby has the old rank 2's pid %s", old[1])
	}
	oldPid, _ := strconv.Atoi(old[1])
	newPid, _ := strconv.Atoi(standby)
	waitGone(t, []int{oldPid}, 30*time.Second)
	t.Logf("rank 2 (pid %d) replaced by the standby of slot 2 (pid %d): %s", oldPid, newPid, took[0])
	if !alive(newPid) {
		t.Errorf("rank 2 (the former standby, pid %d) is not running", newPid)
	}
	if n := strings.Count(log, "SLOW rank 2 "); n != 1 {
		t.Errorf("rank 2 turned slow %d times; want once, in generation 0", n)
	}
	for _, bad := range []string{"generation 1 ended", "restarting", "job failed"} {
		if strings.Contains(log, bad) {
			t.Errorf("the output has %q", bad)
		}
	}
	if t.Failed() {
		t.Logf("output:\n%s", log)
	}
}
