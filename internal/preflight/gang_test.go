package preflight

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

func pairFigs(bw, lat float64) []Figure {
	return []Figure{
		{Check: CheckGang, Subject: "link to n1", Measured: bw, Want: 10, Unit: "MB/s"},
		{Check: CheckGangLatency, Subject: "link to n1", Measured: lat, Want: 100, Unit: "ms", AtMost: true},
	}
}

func gangFigs(bw, lat float64) []Figure {
	return []Figure{
		{Check: CheckGang, Measured: bw, Want: 10, Unit: "MB/s"},
		{Check: CheckGangLatency, Measured: lat, Want: 100, Unit: "ms", AtMost: true},
	}
}

// members: n nodes, all joined, healthy pairs.
func members(n int) []GangMember {
	var ms []GangMember
	for i := range n {
		m := GangMember{NodeID: fmt.Sprintf("node-%d", i+1), Host: fmt.Sprintf("n%d", i+1), Joined: true}
		if i > 0 {
			m.Pair = pairFigs(900, 0.2)
		}
		ms = append(ms, m)
	}
	return ms
}

func TestJudgeGang(t *testing.T) {
	cases := []struct {
		name   string
		edit   func(f *GangFigures)
		passed bool
		out    []string // node ids out
		check  Check    // of the first out
	}{
		{name: "healthy", edit: func(f *GangFigures) {}, passed: true},
		{name: "one never joined", edit: func(f *GangFigures) { f.Members[2].Joined, f.Members[2].Pair = false, nil }, out: []string{"node-3"}, check: CheckGangJoin},
		{name: "slow gang, one slow pair", edit: func(f *GangFigures) {
			f.Gang = gangFigs(900, 450)
			f.Members[3].Pair = pairFigs(900, 400)
		}, out: []string{"node-4"}, check: CheckGangLatency},
		{name: "slow gang, a pair that never ran", edit: func(f *GangFigures) {
			f.Gang = gangFigs(2, 30)
			f.Members[1].Pair = nil
		}, out: []string{"node-2"}, check: CheckGang},
		{name: "slow gang, most pairs slow: the leader", edit: func(f *GangFigures) {
			f.Gang = gangFigs(900, 450)
			for i := 1; i < 4; i++ {
				f.Members[i].Pair = pairFigs(900, 400)
			}
		}, out: []string{"node-1"}, check: CheckGangLatency},
		{name: "slow gang, no pair slow: nobody to blame", edit: func(f *GangFigures) { f.Gang = gangFigs(3, 1) }},
		{name: "healthy gang, a slow pair is not blamed", edit: func(f *GangFigures) { f.Members[2].Pair = pairFigs(1, 400) }, passed: true},
		{name: "gang out of time: a bound fails it", edit: func(f *GangFigures) {
			f.Gang = gangFigs(900, 0.5)
			f.Gang[0].Below = true
			f.Members[1].Pair[0].Below = true
		}, out: []string{"node-2"}, check: CheckGang},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := GangFigures{Members: members(4), Gang: gangFigs(800, 0.5), JoinWait: 8 * time.Second}
			c.edit(&f)
			v := JudgeGang(f)
			if v.Passed != c.passed {
				t.Errorf("passed = %v, want %v: %+v", v.Passed, c.passed, v)
			}
			if strings.Join(v.OutIDs, ",") != strings.Join(c.out, ",") {
				t.Fatalf("out = %v, want %v: %+v", v.OutIDs, c.out, v.Out)
			}
			if len(c.out) > 0 {
				x := v.Out[0]
				if x.Check != c.check || x.Node == "" || x.Measured == "" || x.Expected == "" || x.Fix == "" {
					t.Errorf("verdict %+v: want check %s with node, measured, expected and fix", x, c.check)
				}
				if !v.IsOut(c.out[0]) || v.IsOut("node-0") {
					t.Errorf("IsOut disagrees with OutIDs %v", v.OutIDs)
				}
			}
		})
	}
}

// TestJudgeGangLine: the line of a node the gang check names says the
// host, the check, measured against expected, the fix and Slurm's exclude.
func TestJudgeGangLine(t *testing.T) {
	f := GangFigures{Members: members(3), Gang: gangFigs(900, 450), JoinWait: 8 * time.Second}
	f.Members[2].Pair = pairFigs(900, 400)
	v := JudgeGang(f)
	line := Line(v.Out[0], Scheduler{Slurm: true})
	want := "gotrain: preflight: node n3 failed gang-allreduce-latency on link to n1: measured 400 ms, expected at most 100 ms; fix: this node's network is slow"
	if !strings.HasPrefix(line, want) || !strings.HasSuffix(line, "--exclude=n3") {
		t.Errorf("line\n%s\nwant it to start %q and end with --exclude=n3", line, want)
	}
}
