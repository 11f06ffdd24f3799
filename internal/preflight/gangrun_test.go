package preflight

import (
	"fmt"
	"sync"
	"testing"
	"time"
)

// runGang runs a gang of n in-process members over loopback, with the
// places in absent never joining, and returns each member's verdict.
func runGang(t *testing.T, cfg GangConfig, n int, absent map[int]bool) ([]GangVerdict, time.Duration) {
	t.Helper()
	store := newLocalStore()
	nodes := make([]string, n)
	hosts := make([]string, n)
	for i := range n {
		nodes[i], hosts[i] = fmt.Sprintf("node-%d", i+1), fmt.Sprintf("host%d", i+1)
	}
	verdicts := make([]GangVerdict, n)
	errs := make([]error, n)
	start := time.Now()
	var wg sync.WaitGroup
	for i := range n {
		if absent[i] {
			continue
		}
		wg.Go(func() {
			verdicts[i], errs[i] = Gang(t.Context(), cfg, GangNode{Generation: 0, Index: i, Nodes: nodes, Hosts: hosts, Addr: "127.0.0.1", Token: "secret"}, store)
		})
	}
	wg.Wait()
	took := time.Since(start)
	for i, err := range errs {
		if err != nil {
			t.Fatalf("member %d: %v", i, err)
		}
	}
	return verdicts, took
}

// TestGangHealthy: a healthy gang over loopback passes, every member hears
// the same verdict, and the figures are the gang's.
func TestGangHealthy(t *testing.T) {
	vs, took := runGang(t, QuickGang, 4, nil)
	t.Logf("4 members in %s: %s", took, vs[0].Summary())
	for i, v := range vs {
		if !v.Passed || len(v.Out) != 0 {
			t.Errorf("member %d: %+v, want passed", i, v)
		}
	}
	if len(vs[0].Gang) != 2 {
		t.Errorf("gang verdicts %+v: want a bandwidth and a latency", vs[0].Gang)
	}
}

// TestGangNeverJoins: a node that never joins is named by every member,
// and the check ends within its bound instead of waiting for it.
func TestGangNeverJoins(t *testing.T) {
	cfg := QuickGang
	cfg.JoinWait, cfg.Budget = 2*time.Second, 4*time.Second
	vs, took := runGang(t, cfg, 4, map[int]bool{2: true})
	for _, i := range []int{0, 1, 3} {
		v := vs[i]
		if v.Passed || !v.IsOut("node-3") || len(v.Out) != 1 || v.Out[0].Check != CheckGangJoin || v.Out[0].Node != "host3" {
			t.Errorf("member %d: %+v, want node-3 (host3) out for %s", i, v, CheckGangJoin)
		}
	}
	if limit := cfg.Total() + 10*time.Second; took > limit {
		t.Errorf("the check took %s, longer than its bound %s (and a margin)", took, cfg.Total())
	}
}

// TestGangLeaderNeverJoins: without the leader, every member names it.
func TestGangLeaderNeverJoins(t *testing.T) {
	cfg := QuickGang
	cfg.JoinWait, cfg.Budget = time.Second, 2*time.Second
	vs, _ := runGang(t, cfg, 3, map[int]bool{0: true})
	for _, i := range []int{1, 2} {
		if v := vs[i]; v.Passed || !v.IsOut("node-1") || v.Out[0].Node != "host1" {
			t.Errorf("member %d: %+v, want the leader (node-1, host1) out", i, v)
		}
	}
}

// TestGang64 runs the quick gang check at 64 members on this machine
// (in-process, over loopback): it finishes within its budget, and every
// member hears the leader's verdict. Whether it passes is not asserted:
// here 64 nodes share two cores, which no real gang does.
func TestGang64(t *testing.T) {
	if testing.Short() {
		t.Skip("64 members")
	}
	vs, took := runGang(t, QuickGang, 64, nil)
	t.Logf("64 members: %s in %s (budget %s)", vs[0].Summary(), took.Round(time.Millisecond), QuickGang.Total())
	if took > QuickGang.Total() {
		t.Errorf("the gang check at 64 took %s, over its budget %s", took, QuickGang.Total())
	}
	for i, v := range vs {
		if v.Passed != vs[0].Passed || len(v.OutIDs) != len(vs[0].OutIDs) || len(v.Gang) != 2 {
			t.Fatalf("member %d heard %+v, the leader decided %+v", i, v, vs[0])
		}
	}
	t.Logf("passed %v; %d nodes out", vs[0].Passed, len(vs[0].OutIDs))
}

// TestGangVerdictFromStoreChecked: a verdict another process put that is
// not one (control characters, mismatched lists) is not acted on: the
// member names the leader instead.
func TestGangVerdictFromStoreChecked(t *testing.T) {
	for _, bad := range []GangVerdict{
		{Out: []Verdict{{Node: "x\x1b[2J"}}, OutIDs: []string{"node-2"}},
		{Out: []Verdict{{Node: "x"}}},
	} {
		if bad.valid() {
			t.Errorf("%+v: valid, want refused", bad)
		}
	}
	ok := GangVerdict{Passed: true, Gang: []Verdict{{Node: "h", Check: CheckGang, Measured: "1 MB/s"}}}
	if !ok.valid() {
		t.Errorf("%+v refused", ok)
	}
}
