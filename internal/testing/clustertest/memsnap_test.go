package clustertest

import (
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/gotrain/gotrain/internal/testing/testkit"
	"github.com/gotrain/gotrain/internal/testing/vcluster"
)

// rankFound is an mnist rank's line of where it found its own state.
var rankFound = regexp.MustCompile(`(?m)^\[rank (\d+)\] found the state of step (\d+) in (.*)$`)

// mnistResumed is rank 0's resumed line: the global step the job goes on at.
var mnistResumed = regexp.MustCompile(`(?m)^\[rank 0\] resumed at epoch \d+ step \d+ of \d+ \(global step (\d+)\) from (.*)$`)

// TestNodeLostRankRestoresFromPeer: 3 nodes under --nnodes
// 2:3, MNIST with in-memory snapshots, no disk checkpoint. Rank 1 waits at
// step 30 once its snapshot is in its agent's memory and replicated to its
// ring neighbour (node3, which runs rank 2); then node2 is SIGKILLed, agent
// and worker. The job goes on on node1 and node3, where node3 now runs rank
// 1: it holds no snapshot of its own of rank 1, only the replica node2's
// agent sent it, and the job resumes at step 30 from it: no step is lost.
func TestNodeLostRankRestoresFromPeer(t *testing.T) {
	t.Parallel()
	j := startElasticJob(t, 3, "2:3", []string{"--verbose", "--grace-period", "2s", "--join-settle", "1s"},
		bin.mnist, "--data", bin.data, "--epochs", "1", "--limit", "3000", "--batch-size", "32",
		"--snapshots", "--die-at-step", "30", "--die-rank", "1", "--die-hang")
	victim := j.c.Hosts[1]
	testkit.WaitFor(t, 2*time.Minute, "rank 1 waiting at step 30", func() bool {
		return strings.Contains(j.agents[1].Stdout(), "[rank 1] waiting at step 30 for the node to be killed")
	})
	victim.Kill()
	for _, p := range []int{0, 2} {
		if code, err := j.agents[p].Wait(3 * time.Minute); err != nil || code != 0 {
			t.Fatalf("%s's agent: exit %d, %v\n%s", j.agents[p].Host.Name, code, err, j.c.Dump())
		}
	}
	if g := j.generations(); len(g) < 2 || g[0] != 3 || g[len(g)-1] != 2 {
		t.Errorf("generations' world sizes %v; want 3, then 2", g)
	}
	out := j.agents[0].Stdout() + j.agents[2].Stdout()
	m := mnistResumed.FindStringSubmatch(j.agents[0].Stdout())
	if m == nil || m[1] != "30" {
		t.Fatalf("want the job resumed at global step 30, got %q\n%s", m, j.c.Dump())
	}
	var fromPeer bool
	for _, f := range rankFound.FindAllStringSubmatch(out, -1) {
		if f[1] == "1" && f[2] == "30" && f[3] == "a peer agent's memory" {
			fromPeer = true
		}
	}
	if !fromPeer {
		t.Errorf("rank 1 (now on node3) did not find step 30 in a peer agent's memory:\n%s", out)
	}
	if !strings.Contains(j.agents[2].Stderr(), "a rank restores from the replica a peer node sent here") {
		t.Errorf("node3's agent does not say it served rank 1 from node2's replica:\n%s", j.agents[2].Stderr())
	}
	if f := mnistFinal.FindStringSubmatch(j.agents[0].Stdout()); f == nil || f[2] != "true" {
		t.Errorf("rank 0's final line %q, want ranks_agree=true\n%s", f, j.c.Dump())
	}
}

// TestNodeAndPeerLostRankRestoresFromDisk: 4 nodes under
// --nnodes 2:4, snapshots and a disk checkpoint every 10 steps. Rank 1
// waits at step 30 (its snapshot replicated to node3); then node2 and
// node3, the node that holds its replica, are SIGKILLed. The job goes on
// on node1 and node4, which now runs rank 1: neither its agent nor node1's
// holds anything of rank 1, so rank 1 falls back to the disk checkpoint
// (rank 0 saved step 30), while rank 0 finds its newest snapshot in its own
// agent's memory; the job resumes at step 30, the newest either holds
// (data-parallel ranks hold the same state).
func TestNodeAndPeerLostRankRestoresFromDisk(t *testing.T) {
	t.Parallel()
	ckpt := t.TempDir()
	// One coordinator replica, on node1: the default three would lose
	// their majority with two of the nodes killed here.
	c := newCluster(t, 4)
	j := startJobOn(t, c, c.Hosts, "2:4", []string{"--coordinator-replicas", "1"}, nil, []string{"--verbose", "--grace-period", "2s", "--join-settle", "1s"},
		bin.mnist, "--data", bin.data, "--epochs", "1", "--limit", "4000", "--batch-size", "32",
		"--snapshots", "--checkpoint-dir", ckpt, "--checkpoint-every", "10",
		"--die-at-step", "30", "--die-rank", "1", "--die-hang")
	testkit.WaitFor(t, 2*time.Minute, "rank 1 waiting at step 30", func() bool {
		return strings.Contains(j.agents[1].Stdout(), "[rank 1] waiting at step 30 for the node to be killed")
	})
	j.c.Hosts[1].Kill()
	j.c.Hosts[2].Kill()
	for _, p := range []int{0, 3} {
		if code, err := j.agents[p].Wait(3 * time.Minute); err != nil || code != 0 {
			t.Fatalf("%s's agent: exit %d, %v\n%s", j.agents[p].Host.Name, code, err, j.c.Dump())
		}
	}
	out := j.agents[0].Stdout() + j.agents[3].Stdout()
	if m := mnistResumed.FindStringSubmatch(j.agents[0].Stdout()); m == nil || m[1] != "30" {
		t.Fatalf("want the job resumed at global step 30, got %q\n%s", m, j.c.Dump())
	}
	var fromDisk, rank0Own bool
	for _, f := range rankFound.FindAllStringSubmatch(out, -1) {
		switch {
		case f[1] == "1" && f[3] == "the checkpoint" && f[2] != "0":
			fromDisk = true
		case f[1] == "1" && f[3] != "the checkpoint":
			t.Errorf("rank 1 found its state in %s, though the nodes that held it are gone", f[3])
		case f[1] == "0" && f[3] == "the agent's memory": // step 30, or 29 when 30's hand-over was skipped
			rank0Own = true
		}
	}
	if !fromDisk || !rank0Own {
		t.Errorf("want rank 1 (now on node4) to find its state in the checkpoint and rank 0 its own in its agent's memory:\n%s", out)
	}
	if f := mnistFinal.FindStringSubmatch(j.agents[0].Stdout()); f == nil || f[2] != "true" {
		t.Errorf("rank 0's final line %q, want ranks_agree=true\n%s", f, j.c.Dump())
	}
}

// TestReplacementNodeRankFetchesFromPeer: 3 nodes under
// --nnodes 2:3, MNIST with in-memory snapshots, no disk checkpoint. node2
// is SIGKILLed, agent and worker; the job goes on on node1 and node3,
// whose agents replicate each other's snapshots. Then node2's agent is
// started again, a new process with nothing in its memory, and the job
// grows back to 3 with it as group rank 1 (its --node-rank). Its rank finds
// nothing of its own and no replica on its node: its agent asks the other
// nodes which replica of the rank they hold and fetches the newest over
// the authenticated peer stream, and the rank resumes from it.
func TestReplacementNodeRankFetchesFromPeer(t *testing.T) {
	t.Parallel()
	j := startElasticJob(t, 3, "2:3", []string{"--verbose", "--grace-period", "2s", "--join-settle", "1s"},
		bin.mnist, "--data", bin.data, "--epochs", "20", "--limit", "6000", "--snapshots")
	// Snapshots exist (and were replicated) once the first epoch is done.
	testkit.WaitFor(t, 2*time.Minute, "rank 0's first epoch", func() bool { return strings.Contains(j.agents[0].Stdout(), "[rank 0] epoch=1 ") })
	victim := j.c.Hosts[1]
	victim.Kill()
	testkit.WaitFor(t, time.Minute, "a generation on 2 nodes", func() bool { g := j.generations(); return len(g) >= 2 && g[len(g)-1] == 2 })
	again := victim.Start(j.args[1]...)
	testkit.WaitFor(t, time.Minute, "the job grown back to 3 nodes", func() bool { g := j.generations(); return len(g) >= 3 && g[len(g)-1] == 3 })
	for _, p := range []*vcluster.Proc{j.agents[0], again, j.agents[2]} {
		if code, err := p.Wait(3 * time.Minute); err != nil || code != 0 {
			t.Fatalf("%s's agent: exit %d, %v\n%s", p.Host.Name, code, err, j.c.Dump())
		}
	}
	found := rankFound.FindAllStringSubmatch(again.Stdout(), -1)
	if len(found) == 0 || found[0][1] != "1" || found[0][3] != "a peer agent's memory" || found[0][2] == "0" {
		t.Errorf("the new node2's rank did not find its state in a peer agent's memory: %q\n%s", found, again.Stdout())
	}
	if !strings.Contains(again.Stderr(), "restored a rank from a peer's replica") {
		t.Errorf("the new node2's agent does not say it fetched a peer's replica:\n%s", again.Stderr())
	}
	if f := mnistFinal.FindStringSubmatch(j.agents[0].Stdout()); f == nil || f[2] != "true" {
		t.Errorf("rank 0's final line %q, want ranks_agree=true\n%s", f, j.c.Dump())
	}
	t.Logf("the new node's restore: %q; its agent: %s", found, grepLine(again.Stderr(), "restored a rank from a peer's replica"))
}

// grepLine is the first line of s that holds sub.
func grepLine(s, sub string) string {
	for l := range strings.Lines(s) {
		if strings.Contains(l, sub) {
			return strings.TrimSpace(l)
		}
	}
	return ""
}
