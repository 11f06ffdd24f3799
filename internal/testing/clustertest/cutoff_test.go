package clustertest

import (
	"strings"
	"testing"
	"time"

	"github.com/gotrain/gotrain/internal/testing/testkit"
	"github.com/gotrain/gotrain/internal/testing/vcluster"
)

// nodeTimeout is the agents' node timeout (the default --node-timeout).
const nodeTimeout = 10 * time.Second

// TestCutOffNodeStops: 4 nodes, --nnodes 4 (fixed) and the default
// replicated coordinator; a node is cut off both ways, the job ends on the
// others (naming it), and the partition is lifted: every process on the
// cut-off host (its agent and its workers) is gone within twice the node
// timeout of the cut (plus the grace period and a margin for a loaded
// machine), and its agent exits non-zero with a report that says it was
// cut off, or that the job lost it. While cut off it never says it is back
// in contact. Once with a node that hosts a replica of the coordinator
// (its own replica still answers it, leaderless), once with one that hosts
// none.
func TestCutOffNodeStops(t *testing.T) {
	t.Parallel()
	for _, hosting := range []bool{true, false} {
		name := "plain node"
		if hosting {
			name = "replica host"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			cutOffNodeStops(t, hosting)
		})
	}
}

func cutOffNodeStops(t *testing.T, hosting bool) {
	const grace = 2 * time.Second
	j := startJob(t, 4, []string{"--verbose", "--grace-period", grace.String(), "--max-restarts", "0"}, bin.mnist, "--data", bin.data, "--epochs", "20")
	j.running(t)
	// Node 1 runs the first replica (the leader); two of the others host
	// the rest once they joined.
	var victim *vcluster.Host
	testkit.WaitFor(t, time.Minute, "two nodes hosting a replica", func() bool {
		var hosts, plain []*vcluster.Host
		for _, p := range j.agents[1:] {
			if strings.Contains(p.Stderr(), "gotrain: this node hosts a replica of the coordinator at ") {
				hosts = append(hosts, p.Host)
			} else {
				plain = append(plain, p.Host)
			}
		}
		if len(hosts) < 2 {
			return false
		}
		if victim = plain[0]; hosting {
			victim = hosts[len(hosts)-1]
		}
		return true
	})
	agent := victim.Proc()
	if pids := victim.Pids(); len(pids) < 2 {
		t.Fatalf("%s runs %v: want its agent and its worker", victim.Name, pids)
	}
	atCut := len(agent.Stderr())
	cut := time.Now()
	victim.Partition(vcluster.Both)
	// The partition is lifted as soon as the job ended elsewhere: the
	// first other agent has its verdict; replicas may still run.
	testkit.WaitFor(t, 2*time.Minute, "the job's end on another node", func() bool {
		for _, p := range j.agents {
			if p.Host != victim && strings.Contains(p.Stderr(), "gotrain: job failed: ") {
				return true
			}
		}
		return false
	})
	healed := time.Now()
	cutOff := agent.Stderr()[atCut:]
	victim.Heal()
	// A stream that opens into the partition (it does, locally) is no
	// contact: the node must not say it is back, nor start its node
	// timeout again.
	if strings.Contains(cutOff, "back in contact") {
		t.Errorf("%s's agent said it was back in contact while cut off:\n%s", victim.Name, cutOff)
	}
	t.Logf("the job ended on the others %v after the cut; %s healed", healed.Sub(cut).Round(time.Millisecond), victim.Name)
	j.othersFail(t, victim, "although "+victim.Name+" was cut off")
	for _, p := range j.agents {
		if p.Host == victim {
			continue
		}
		if m := lostReport.FindStringSubmatch(p.Stderr()); m == nil || m[2] != victim.Name {
			t.Errorf("%s's report does not name %s, the node cut off: %q; its last lines:\n%s", p.Host.Name, victim.Name, m, tail(p.Stderr(), 5))
		}
	}
	// The bound: the node's workers stop within twice the node timeout of
	// the cut, then their grace period; the margin is for a loaded machine.
	bound := 2*nodeTimeout + grace + 5*time.Second
	var left []int
	for deadline := cut.Add(bound); ; time.Sleep(50 * time.Millisecond) {
		if left = victim.Pids(); len(left) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s still runs %v %v after the cut (%v after the heal); its agent's last lines:\n%s",
				victim.Name, left, time.Since(cut).Round(time.Millisecond), time.Since(healed).Round(time.Millisecond), tail(agent.Stderr(), 15))
		}
	}
	gone := time.Now()
	code, err := agent.Wait(10 * time.Second)
	if err != nil || code == 0 {
		t.Errorf("%s's agent: exit %d, %v; want non-zero", victim.Name, code, err)
	}
	// It says it was cut off, or, where it heard from a replica that
	// knows the job's end, that end: this node was lost.
	last := tail(agent.Stderr(), 3)
	if m := lostReport.FindStringSubmatch(last); !strings.Contains(last, "cut off") && (m == nil || m[2] != victim.Name) {
		t.Errorf("%s's agent's report does not say it was cut off, nor that the job lost it; its last lines:\n%s", victim.Name, last)
	}
	t.Logf("TIMING cut-off %s: every process on it gone %v after the cut (%v after the heal); its agent's report: %s",
		victim.Name, gone.Sub(cut).Round(time.Millisecond), gone.Sub(healed).Round(time.Millisecond), tail(agent.Stderr(), 1))
	if t.Failed() {
		t.Log(j.c.Dump())
	}
}
