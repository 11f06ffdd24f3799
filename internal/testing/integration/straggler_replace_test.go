package integration

import (
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// With --on-straggler replace, a rank that is a
// straggler in its first incarnation only (testprog --slow-generation 0)
// is replaced once its verdict has stood for --straggler-persist, and the
// job's step rate recovers; with the default (report) nothing is replaced.
// The checks are on what happened (which lines, which generation), and the
// one rate check compares the job with itself, so a loaded machine slows
// both sides alike.

// stepLine is testprog's --step-lines output (after the agent's "[rank R] ").
var stepLine = regexp.MustCompile(`STEP rank (\d+) gen (\d+) seq (\d+) unix_ms (\d+)$`)

// replacedLine is every agent's line for a replacement.
var replacedLine = regexp.MustCompile(`^gotrain: generation 0 ended: replacing rank 2 on host \S+, the straggler for \d+s \(--on-straggler replace\): rank 2 on host \S+ is the straggler`)

// stragglerArgs runs testprog's training loop on 3 CPU ranks, rank 2 three
// times slower from step 10 of generation 0; restarts are off, so a
// replacement that counted as one would end the job.
func stragglerArgs(flags ...string) []string {
	args := append([]string{"launch", "--nproc-per-node", "3", "--backend", "cpu", "--max-restarts", "0", "--grace-period", "1s",
		"--straggler-persist", "5s"}, flags...)
	return append(args, "--", bin.testprog, "hang", "--fault", "none", "--steps", "100000", "--step-time", "200ms", "--jitter", "50ms",
		"--slow-rank", "2", "--slow-from", "10", "--slow-step-time", "600ms", "--slow-generation", "0", "--step-lines")
}

// stepAt is rank 0's STEP line: generation, seq, and the worker's clock.
type stepAt struct {
	gen, seq int64
	at       time.Time
}

func parseStep(t *testing.T, l line) stepAt {
	m := stepLine.FindStringSubmatch(l.text)
	gen, _ := strconv.ParseInt(m[2], 10, 64)
	seq, _ := strconv.ParseInt(m[3], 10, 64)
	ms, err := strconv.ParseInt(m[4], 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return stepAt{gen, seq, time.UnixMilli(ms)}
}

// rate is the steps per second from a to b.
func rate(a, b stepAt) float64 { return float64(b.seq-a.seq) / b.at.Sub(a.at).Seconds() }

// rank0Step waits for rank 0's STEP line of generation gen at seq or later.
func (r *running) rank0Step(t *testing.T, gen, seq int64, timeout time.Duration) stepAt {
	t.Helper()
	re := regexp.MustCompile(`STEP rank 0 gen ` + strconv.FormatInt(gen, 10) + ` seq (\d+) `)
	deadline := time.Now().Add(timeout)
	for {
		l := r.waitFor(t, re, time.Until(deadline))
		if s := parseStep(t, l); s.seq >= seq {
			return s
		}
	}
}

func TestStragglerReplaced(t *testing.T) {
	t.Parallel()
	r := startLaunch(t, t.TempDir(), stragglerArgs("--on-straggler", "replace")...)
	r.waitFor(t, regexp.MustCompile(`SLOW rank 2 seq 10 `), 90*time.Second)
	slowFrom := r.rank0Step(t, 0, 12, 30*time.Second) // the slow steps, past the first
	named := r.waitFor(t, stragglerVerdict, 60*time.Second)
	if m := stragglerVerdict.FindStringSubmatch(named.text); m[1] != "2" {
		t.Fatalf("named rank %s, want 2: %s", m[1], named.text)
	}
	slowTo := r.rank0Step(t, 0, slowFrom.seq+5, 30*time.Second)
	ended := r.waitFor(t, replacedLine, 60*time.Second)
	t.Logf("replaced %s after the verdict: %s", ended.at.Sub(named.at).Round(100*time.Millisecond), ended.text)
	if d := ended.at.Sub(named.at); d < 4*time.Second {
		t.Errorf("replaced %s after the verdict, before --straggler-persist 5s", d)
	}
	// Generation 1 runs every rank afresh, rank 2 at full speed: the same
	// number of steps takes less time than while it was slow.
	from := r.rank0Step(t, 1, 5, 60*time.Second)
	to := r.rank0Step(t, 1, from.seq+slowTo.seq-slowFrom.seq, 60*time.Second)
	slow, fast := rate(slowFrom, slowTo), rate(from, to)
	t.Logf("rank 0's steps/s: %.2f while rank 2 was slow, %.2f after the replacement", slow, fast)
	if fast < 1.25*slow {
		t.Errorf("the step rate did not recover: %.2f steps/s after the replacement, %.2f while rank 2 was slow", fast, slow)
	}
	// One generation change, not a restart (restarts are off), and the new
	// rank 2 is not slow.
	log := r.log.String()
	if n := strings.Count(log, "SLOW rank 2 "); n != 1 {
		t.Errorf("rank 2 turned slow %d times; want once, in generation 0:\n%s", n, log)
	}
	for _, bad := range []string{"generation 1 ended", "restarting", "job failed"} {
		if strings.Contains(log, bad) {
			t.Errorf("the log has %q:\n%s", bad, log)
		}
	}
}

func TestStragglerReportOnly(t *testing.T) {
	t.Parallel()
	r := startLaunch(t, t.TempDir(), stragglerArgs()...) // --on-straggler report, the default
	named := r.waitFor(t, stragglerVerdict, 120*time.Second)
	at := r.rank0Step(t, 0, 0, 30*time.Second)
	// Well past --straggler-persist 5s at the slow pace (0.6 s a step):
	// nothing happens but the verdict.
	r.rank0Step(t, 0, at.seq+25, 90*time.Second)
	if strings.Contains(r.log.String(), "generation 0 ended") || strings.Contains(r.log.String(), " gen 1 ") {
		t.Errorf("--on-straggler report replaced the straggler:\n%s", r.log.String())
	}
	t.Logf("named and left alone: %s", named.text)
}
