package integration

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// An unchanged PyTorch DDP program on gloo whose rank 1
// stops calling collectives (it sleeps, or spins in Python) is named like
// a Go worker: "never entered allreduce #N", with the waiting ranks, in
// the launcher's output and in `gotrain diagnose`; with --hang-timeout and
// with the adaptive timeout (none given). Its collectives come from
// gotrain's PyTorch hook (the agent's sitecustomize on PYTHONPATH).
func TestTorchGlooRankThatStopsCallingCollectivesIsNamed(t *testing.T) {
	t.Parallel()
	path := needTorch(t)
	script := testdata(t, "gloo_hang.py")
	for _, tc := range []struct {
		fault    string
		step     int
		adaptive bool
	}{
		{fault: "stop", step: 5},
		{fault: "spin", step: 40, adaptive: true}, // enough completions for the rhythm
	} {
		t.Run(tc.fault, func(t *testing.T) {
			t.Parallel()
			args := []string{"launch", "--nproc-per-node", "3", "--backend", "cpu", "--max-restarts", "0", "--grace-period", "1s"}
			if !tc.adaptive {
				args = append(args, "--hang-timeout", hangTimeout.String())
			}
			args = append(args, "--", script, "--fault", tc.fault, "--fault-rank", "1", "--fault-step", strconv.Itoa(tc.step), "--jitter", "0.05")
			r := startLaunchEnv(t, []string{"XDG_RUNTIME_DIR=" + t.TempDir(), path}, args...)
			fl := r.waitFor(t, faultLine, 3*time.Minute) // three interpreters importing torch on a loaded machine
			began := faultTime(t, fl)
			seq := faultLine.FindStringSubmatch(fl.text)[2]
			want := regexp.MustCompile(fmt.Sprintf(`^gotrain: hang detected \(never-entered, generation 0\): .*rank 1 \(pid \d+ on [^)]+\) never entered allreduce #%s`, seq))
			l := r.waitFor(t, want, verdictLimit+hangTimeout)
			d := l.at.Sub(began)
			t.Logf("%s: verdict %s after the fault: %s", tc.fault, d.Round(10*time.Millisecond), l.text)
			floor := hangTimeout
			if tc.adaptive {
				floor = time.Second // the adaptive timeout's floor; its fallback (2 minutes) is far beyond verdictLimit
			}
			if d < floor-100*time.Millisecond {
				t.Errorf("the verdict came %s after the fault, before the timeout's %s", d, floor)
			}
			v := diagnose(t, r).GetStatus().GetVerdicts()
			if len(v) != 1 || v[0].GetKind() != "never-entered" || len(v[0].GetCulprits()) != 1 || v[0].GetCulprits()[0].GetRank() != 1 ||
				fmt.Sprint(v[0].GetCollective().GetSeq()) != seq || v[0].GetCollective().GetOp() != "allreduce" || v[0].GetTimeoutAdaptive() != tc.adaptive {
				t.Fatalf("diagnose verdicts: %v", v)
			}
			t.Logf("timeout %dms (adaptive %v)", v[0].GetTimeoutMs(), v[0].GetTimeoutAdaptive())
			if got := v[0].GetWaiting(); len(got) != 2 || got[0] != 0 || got[1] != 2 {
				t.Errorf("waiting ranks %v, want [0 2]", got)
			}
			if !strings.Contains(strings.Join(v[0].GetDetails(), "\n"), "seen through gotrain's PyTorch hook") {
				t.Errorf("the verdict does not say where its collectives come from: %v", v[0].GetDetails())
			}
			// The culprit's Python stack, from the hook's faulthandler, names
			// the function it is stuck in.
			stack := waitPythonStack(t, r, 1)
			if !regexp.MustCompile(`(?m)^\s*File ".*gloo_hang\.py", line \d+ in stop_calling_collectives$`).MatchString(stack) {
				t.Errorf("rank 1's Python stack does not name stop_calling_collectives:\n%s", stack)
			}
		})
	}
}

// A gloo rank that turns slow is named the
// straggler from the hook's completion times and waits.
func TestTorchGlooStragglerNamed(t *testing.T) {
	t.Parallel()
	path := needTorch(t)
	const slowRank, slowFrom = 2, 30
	r := startLaunchEnv(t, []string{"XDG_RUNTIME_DIR=" + t.TempDir(), path}, "launch", "--nproc-per-node", "3", "--backend", "cpu",
		"--max-restarts", "0", "--grace-period", "1s", "--",
		testdata(t, "gloo_hang.py"), "--fault", "none", "--step-time", "0.2", "--jitter", "0.05",
		"--slow-rank", strconv.Itoa(slowRank), "--slow-from", strconv.Itoa(slowFrom), "--slow-step-time", "0.6")
	sl := r.waitFor(t, slowLine, 3*time.Minute)
	if strings.Contains(r.log.String(), "gotrain: straggler") || strings.Contains(r.log.String(), "hang detected") {
		t.Fatalf("a verdict before the slowdown:\n%s", r.log.String())
	}
	l := r.waitFor(t, stragglerVerdict, 60*time.Second)
	m := stragglerVerdict.FindStringSubmatch(l.text)
	t.Logf("named %s after the slowdown: %s", l.at.Sub(slowTime(t, sl)).Round(10*time.Millisecond), l.text)
	if m[1] != strconv.Itoa(slowRank) {
		t.Fatalf("named rank %s, want %d: %s", m[1], slowRank, l.text)
	}
	if slower, _ := strconv.Atoi(m[2]); slower < 30 {
		t.Errorf("%d %% slower; want a clear straggler: %s", slower, l.text)
	}
	// The straggler's Python stack is its verdict's evidence too.
	if stack := waitPythonStack(t, r, slowRank); !regexp.MustCompile(`(?m)^\s*File ".*gloo_hang\.py", line \d+ in <module>$`).MatchString(stack) {
		t.Errorf("rank %d's Python stack does not show the training loop:\n%s", slowRank, stack)
	}
}

// waitPythonStack waits for the evidence of the job's hang verdict to hold
// rank's Python stack (the agent collects it once the verdict is out) and
// returns it.
func waitPythonStack(t *testing.T, r *running, rank int32) string {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		var kinds []string
		for _, v := range diagnose(t, r).GetStatus().GetVerdicts() {
			for _, e := range v.GetEvidence() {
				if e.GetRank() == rank && e.GetKind() == "python" {
					return e.GetText()
				}
				kinds = append(kinds, fmt.Sprintf("rank %d %s: %s", e.GetRank(), e.GetKind(), e.GetText()))
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no Python stack of rank %d in the verdict's evidence within a minute; evidence:\n%s", rank, strings.Join(kinds, "\n"))
		}
		time.Sleep(500 * time.Millisecond)
	}
}
