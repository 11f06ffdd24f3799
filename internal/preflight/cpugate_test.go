package preflight

import (
	"testing"
	"time"
)

// TestCPUGateHealthy runs the real gate on this machine: a healthy node
// passes it, whatever else runs here (the thresholds are far from what
// two loaded cores do).
func TestCPUGateHealthy(t *testing.T) {
	figs, err := CPUGate(t.Context(), QuickCPU)
	if err != nil {
		t.Fatal(err)
	}
	res := Judge("here", figs)
	t.Logf("%+v", res.Verdicts)
	if !res.Passed {
		t.Errorf("a healthy node failed the gate: %+v", res.Failed())
	}
	if len(figs) != 2 || figs[0].Measured <= 0 {
		t.Errorf("figures %+v: want a bandwidth and a latency", figs)
	}
}

// TestCPUGateOutOfBudget: a gate that cannot finish within its budget fails
// with a bound, and returns within about the budget.
func TestCPUGateOutOfBudget(t *testing.T) {
	cfg := QuickCPU
	cfg.Bytes, cfg.Rounds, cfg.Budget = 256<<20, 1000, 300*time.Millisecond
	figs, err := CPUGate(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	res := Judge("here", figs)
	if res.Passed {
		t.Fatalf("%+v: an unfinished gate passed", res.Verdicts)
	}
	bw := res.Verdicts[0]
	if bw.Check != CheckCPUBusBW || bw.OK || bw.Measured[0] != '<' {
		t.Errorf("bandwidth verdict %+v: want a failed bound (<)", bw)
	}
}

func TestCPUGateNeedsTwoRanks(t *testing.T) {
	cfg := QuickCPU
	cfg.Ranks = 1
	if _, err := CPUGate(t.Context(), cfg); err == nil {
		t.Error("one rank: want an error")
	}
}
