package clustertest

// The chaos battery: blips just under the node timeout, a
// leader cut off from the agents only, two replica hosts lost together.
// CI runs a few cases; with $GOTRAIN_CHAOS set (bench/cluster_faults.sh)
// every case runs.

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/gotrain/gotrain/internal/testing/testkit"
	"github.com/gotrain/gotrain/internal/testing/vcluster"
)

// chaos says whether the whole battery runs (bench/cluster_faults.sh).
func chaos() bool { return os.Getenv("GOTRAIN_CHAOS") != "" }

// chaosLine logs a scenario's timings for bench/cluster_faults.sh: from
// the fault to its detection (the coordinator's first word on it) and to
// the recovery (the job served again); zero when not seen.
func chaosLine(t *testing.T, detect, recover time.Duration) {
	t.Helper()
	d := func(v time.Duration) string {
		if v <= 0 {
			return "-"
		}
		return v.Round(time.Millisecond).String()
	}
	t.Logf("CHAOS scenario=%s detect=%s recover=%s", t.Name(), d(detect), d(recover))
}

// since is t - from, or 0 when t is zero.
func since(from, t time.Time) time.Duration {
	if t.IsZero() {
		return 0
	}
	return t.Sub(from)
}

// outOfContactMsg is the coordinator's line for a node whose stream it
// lost while gossip still hears it.
const outOfContactMsg = "node out of contact with this coordinator; its peers still hear it"

// hostsMsg is what a node hosting a replica of the coordinator prints.
const hostsMsg = "gotrain: this node hosts a replica of the coordinator at "

// replicaHosts waits until want nodes besides node 1 host a replica, and
// returns those and the others.
func (j *job) replicaHosts(t *testing.T, want int) (hosting, plain []*vcluster.Host) {
	t.Helper()
	testkit.WaitFor(t, 2*time.Minute, fmt.Sprintf("%d nodes hosting a replica", want), func() bool {
		hosting, plain = nil, nil
		for _, p := range j.agents[1:] {
			if strings.Contains(p.Stderr(), hostsMsg) {
				hosting = append(hosting, p.Host)
			} else {
				plain = append(plain, p.Host)
			}
		}
		return len(hosting) >= want
	})
	return hosting, plain
}

// blip is a fault that cuts a host off for a while and ends by itself.
type blip struct {
	name string
	cut  func(h *vcluster.Host)
	heal func(h *vcluster.Host)
}

var (
	bothWays = blip{"both", func(h *vcluster.Host) { h.Partition(vcluster.Both) }, (*vcluster.Host).Heal}
	linkDown = blip{"link", (*vcluster.Host).LinkDown, (*vcluster.Host).LinkUp}
)

// TestBlipUnderNodeTimeout: a node is cut off for 8 s or 9 s (under the
// 10 s node timeout), both ways by iptables or by its link going down,
// while a 4-node MNIST job trains with the default (replicated)
// coordinator; the node hosts a replica, or none. Every blip is ridden
// out: every agent exits 0 after one generation whose ranks agree, and no
// node is lost. CI runs two cases; $GOTRAIN_CHAOS runs all eight.
func TestBlipUnderNodeTimeout(t *testing.T) {
	t.Parallel()
	type tc struct {
		d       time.Duration
		fault   blip
		hosting bool
	}
	cases := []tc{{9 * time.Second, bothWays, true}, {8 * time.Second, linkDown, false}}
	if chaos() {
		cases = nil
		for _, d := range []time.Duration{8 * time.Second, 9 * time.Second} {
			for _, f := range []blip{bothWays, linkDown} {
				for _, h := range []bool{true, false} {
					cases = append(cases, tc{d, f, h})
				}
			}
		}
	}
	for _, c := range cases {
		where := "plain"
		if c.hosting {
			where = "replica-host"
		}
		t.Run(fmt.Sprintf("%s-%s-%s", c.d, c.fault.name, where), func(t *testing.T) {
			t.Parallel()
			rideOut(t, c.d, c.fault, c.hosting)
		})
	}
}

func rideOut(t *testing.T, d time.Duration, fault blip, hosting bool) {
	j := startJob(t, 4, []string{"--verbose", "--max-restarts", "0"}, bin.mnist, "--data", bin.data, "--epochs", "12", "--limit", "12000")
	j.running(t)
	hosts, plain := j.replicaHosts(t, 2)
	victim := plain[0]
	if hosting {
		victim = hosts[len(hosts)-1]
	}
	cut := time.Now()
	fault.cut(victim)
	time.Sleep(d) // the fault's length, not a wait for a condition
	fault.heal(victim)
	healed := time.Now()
	for _, p := range j.agents {
		if code, err := p.Wait(4 * time.Minute); err != nil || code != 0 {
			t.Fatalf("%s's agent after a %s %s blip of %s: exit %d, %v\n%s", p.Host.Name, d, fault.name, victim.Name, code, err, j.c.Dump())
		}
	}
	var finished time.Time
	for _, p := range j.agents {
		if p.Ended.After(finished) {
			finished = p.Ended
		}
	}
	if !finished.After(healed) {
		t.Fatal("the job finished before the blip was over: train longer")
	}
	m := mnistFinal.FindStringSubmatch(j.agents[0].Stdout())
	if m == nil || m[2] != "true" {
		t.Errorf("rank 0's final line %q, want ranks_agree=true", m)
	}
	if gens := j.generations(); len(gens) != 1 {
		t.Errorf("generations %v; want one, the blip changing nothing", gens)
	}
	// Detection: the first "node unreachable" after the cut on any
	// replica; recovery: the first "node reachable again" after it.
	var unreach, back time.Time
	for _, p := range j.agents {
		for _, l := range append(lines(p, "node unreachable"), lines(p, outOfContactMsg)...) {
			if l.at.After(cut) && (unreach.IsZero() || l.at.Before(unreach)) {
				unreach = l.at
			}
		}
		for _, l := range lines(p, "node reachable again") {
			if l.at.After(cut) && (back.IsZero() || l.at.Before(back)) {
				back = l.at
			}
		}
	}
	if !unreach.IsZero() {
		t.Logf("TIMING blip %s %s %s: unreachable %v after the cut; reachable again %v after the heal",
			d, fault.name, victim.Name, unreach.Sub(cut).Round(time.Millisecond), back.Sub(healed).Round(time.Millisecond))
	}
	chaosLine(t, since(cut, unreach), since(healed, back))
	if t.Failed() {
		t.Log(j.c.Dump())
	}
}

// TestTwoReplicaHostsLost: 5 nodes under --nnodes 3:5 keep 5 replicas of
// the coordinator (node 1's and 4 hosted); two nodes that host one are
// SIGKILLed together: 3 of 5 replicas remain, a majority, so the job goes
// on on the 3 survivors (MIN) and finishes with ranks that agree. With
// $GOTRAIN_CHAOS, also node 1 (the leader's host) and one replica host.
func TestTwoReplicaHostsLost(t *testing.T) {
	t.Parallel()
	cases := []bool{false}
	if chaos() {
		cases = append(cases, true)
	}
	for _, withLeader := range cases {
		name := "two-hosted"
		if withLeader {
			name = "node1-and-hosted"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			twoReplicaHostsLost(t, withLeader)
		})
	}
}

func twoReplicaHostsLost(t *testing.T, withLeader bool) {
	ckpt := t.TempDir()
	j := startElasticJob(t, 5, "3:5", []string{"--verbose", "--grace-period", "2s", "--join-settle", "1s"},
		bin.mnist, "--data", bin.data, "--epochs", "15", "--checkpoint-dir", ckpt)
	j.running(t)
	hosting, _ := j.replicaHosts(t, 4)
	victims := []*vcluster.Host{hosting[0], hosting[1]}
	if withLeader {
		victims[0] = j.c.Hosts[0]
	}
	var survivors []*vcluster.Proc
	for _, p := range j.agents {
		if p.Host != victims[0] && p.Host != victims[1] {
			survivors = append(survivors, p)
		}
	}
	killed := time.Now()
	victims[0].Kill()
	victims[1].Kill()
	for _, p := range survivors {
		if code, err := p.Wait(4 * time.Minute); err != nil || code != 0 {
			t.Fatalf("%s's agent after %s and %s were killed: exit %d, %v\n%s", p.Host.Name, victims[0].Name, victims[1].Name, code, err, j.c.Dump())
		}
	}
	var final []string
	for _, p := range survivors {
		if m := mnistFinal.FindStringSubmatch(p.Stdout()); m != nil {
			final = m
		}
	}
	if final == nil || final[2] != "true" {
		t.Errorf("rank 0's final line %q, want ranks_agree=true", final)
	}
	for _, p := range survivors {
		if strings.Contains(p.Stderr(), "no majority") {
			t.Errorf("%s's agent speaks of no majority with 3 of 5 replicas left:\n%s", p.Host.Name, tail(p.Stderr(), 5))
		}
	}
	// Timing from the first survivor's own log: the 3-node generation.
	s := (&job{agents: survivors[:1]})
	at := s.generationAfter(3, killed)
	if !at.IsZero() {
		t.Logf("TIMING two replica hosts lost (%s, %s): the 3-node generation started %v after the SIGKILLs", victims[0].Name, victims[1].Name, at.Sub(killed).Round(time.Millisecond))
	}
	var lost time.Time
	for _, p := range survivors {
		for _, l := range lines(p, "node lost") {
			if l.at.After(killed) && (lost.IsZero() || l.at.Before(lost)) {
				lost = l.at
			}
		}
	}
	chaosLine(t, since(killed, lost), since(killed, at))
	if t.Failed() {
		t.Log(j.c.Dump())
	}
}

// handOverMsg is what a leader that the agents do not reach logs.
const handOverMsg = "the agents do not reach this coordinator replica: handing the lead to another replica"

// TestLeaderCutOffFromAgents: three standalone replicas serve a 2-node
// MNIST job; the leader's host drops the agents' gRPC traffic only (its
// gRPC port; Raft and gossip flow, so the replicas still hear their
// leader and no election happens by itself): the leader, no longer hearing
// the agents, hands the lead over; every agent's stream resumes at the new
// leader and the job finishes with one generation and ranks that agree.
func TestLeaderCutOffFromAgents(t *testing.T) {
	t.Parallel()
	r := startReplicatedJob(t, 2, []string{"--verbose", "--max-restarts", "0"}, replicatedMNIST()...)
	r.running(t)
	// The leader must have heard the agents before they go silent: their
	// heartbeats go out once a second from the generation's start, and a
	// cut in the first second (seen in CI) leaves a leader that never
	// heard them, which has nothing to miss. An epoch done is seconds of
	// heartbeats.
	testkit.WaitFor(t, time.Minute, "rank 0's first epoch", func() bool {
		for _, p := range r.agents {
			if strings.Contains(p.Stdout(), "epoch=1 ") {
				return true
			}
		}
		return false
	})
	old, _ := r.leader()
	cut := time.Now()
	if out, err := old.Host.Exec("iptables", "-A", "INPUT", "-p", "tcp", "--dport", replicaPort, "-j", "DROP"); err != nil {
		t.Fatalf("drop the agents' traffic on %s: %v: %s", old.Host.Name, err, out)
	}
	nl := r.waitNewLeader(t, old)
	led := lines(nl, leadsMsg)
	served := resumedAt(nl, len(r.agents), cut, time.Minute)
	if served.IsZero() {
		t.Errorf("the new leader on %s logged no resumed watch stream for every agent:\n%s", nl.Host.Name, tail(nl.Stderr(), 20))
	} else {
		t.Logf("TIMING agent-only cut of the leader (%s): a new leader (%s) %v after the cut; every agent's stream resumed there %v after it",
			old.Host.Name, nl.Host.Name, led[len(led)-1].at.Sub(cut).Round(time.Millisecond), served.Sub(cut).Round(time.Millisecond))
	}
	var handed time.Time
	for _, l := range lines(old, handOverMsg) {
		if l.at.After(cut) {
			handed = l.at
			break
		}
	}
	chaosLine(t, since(cut, handed), since(cut, served))
	r.finishesOnOneGeneration(t, "after the leader was cut off from the agents")
	old.Host.Heal()
	r.replicasExit(t, nil)
	if t.Failed() {
		t.Log(r.c.Dump())
	}
}
