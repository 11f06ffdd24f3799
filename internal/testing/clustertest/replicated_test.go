package clustertest

// The replicated coordinator on the virtual cluster: three
// standalone replicas and two agents, the leader SIGKILLed or cut off, two
// replicas lost; and an embedded replica set whose first node dies.

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gotrain/gotrain/internal/testing/testkit"
	"github.com/gotrain/gotrain/internal/testing/vcluster"
)

// replicaPort is the standalone replicas' gRPC port (gossip + 1, Raft + 3).
const replicaPort = "29400"

// replicatedJob is a job served by three standalone replicas (hosts 1–3)
// with an agent on each other host (the embedded job's fields: agents,
// logDir, args).
type replicatedJob struct {
	*job
	replicas []*vcluster.Proc // on hosts 1–3
	peers    []string         // their gRPC addresses, --peers
	caHash   string
}

// startReplicatedJob makes a cluster of 3+agents hosts: hosts 1–3 run
// `gotrain coordinator --peers …` for a job of agents nodes, the others
// `gotrain launch --coordinator A1,A2,A3` with one CPU rank each,
// agentFlags, and program (after `--`). Its agents start once the replica
// set has a leader.
func startReplicatedJob(t *testing.T, agents int, agentFlags []string, program ...string) *replicatedJob {
	t.Helper()
	tok := make([]byte, 24)
	if _, err := rand.Read(tok); err != nil {
		t.Fatal(err)
	}
	c := vcluster.New(t, 3+agents, vcluster.Options{Env: []string{"GOTRAIN_JOB_TOKEN=" + hex.EncodeToString(tok)}})
	r := &replicatedJob{job: &job{c: c}}
	for _, h := range c.Hosts[:3] {
		r.peers = append(r.peers, h.IP+":"+replicaPort)
	}
	peers := strings.Join(r.peers, ",")
	for i, h := range c.Hosts[:3] {
		r.replicas = append(r.replicas, h.Start(bin.gotrain, "coordinator", "--peers", peers, "--listen", r.peers[i],
			"--nnodes", fmt.Sprint(agents), "--max-restarts", "0"))
	}
	testkit.WaitFor(t, time.Minute, "a leader among the replicas, and the CA's hash", func() bool {
		for _, p := range r.replicas {
			select {
			case <-p.Done():
				t.Fatalf("the replica on %s exited before the job ran\n%s", p.Host.Name, c.Dump())
			default:
			}
			if m := caHashFlag.FindStringSubmatch(p.Stderr()); m != nil {
				if r.caHash != "" && r.caHash != m[1] {
					t.Fatalf("the replicas print different CA hashes: %s and %s\n%s", r.caHash, m[1], c.Dump())
				}
				r.caHash = m[1]
			}
		}
		_, ok := r.leader()
		return ok && r.caHash != ""
	})
	for i, h := range c.Hosts[3:] {
		dir := filepath.Join(t.TempDir(), h.Name)
		r.logDir = append(r.logDir, dir)
		// --node-rank: the first agent runs rank 0 whichever joins first
		// (a standalone coordinator has no node of its own to put first).
		args := []string{bin.gotrain, "launch", "--nnodes", fmt.Sprint(agents), "--nproc-per-node", "1", "--backend", "cpu",
			"--node-addr", h.IP, "--log-dir", dir, "--coordinator", peers, "--ca-hash", r.caHash, "--node-rank", fmt.Sprint(i)}
		args = append(append(append(args, agentFlags...), "--"), program...)
		r.args = append(r.args, args)
		r.agents = append(r.agents, h.Start(args...))
	}
	r.lastStart = time.Now()
	return r
}

// anyLogLine is one line of slog's text format, with or without a host
// attribute (the standalone coordinator logs none).
var anyLogLine = regexp.MustCompile(`(?m)^time=(\S+) level=\S+ msg="([^"]*)"(.*)$`)

// lines are p's log lines whose message is msg, host or not.
func lines(p *vcluster.Proc, msg string) []logLine {
	var ls []logLine
	for _, m := range anyLogLine.FindAllStringSubmatch(p.Stderr(), -1) {
		if m[2] != msg {
			continue
		}
		at, err := time.Parse(time.RFC3339Nano, m[1])
		if err != nil {
			continue
		}
		ls = append(ls, logLine{at: at, msg: m[2], rest: m[3]})
	}
	return ls
}

const leadsMsg = "coordinator replica leads"

// leader is the replica that took the lead last (by its log), if any did.
func (r *replicatedJob) leader() (*vcluster.Proc, bool) {
	var last time.Time
	var leader *vcluster.Proc
	for _, p := range r.replicas {
		for _, l := range lines(p, leadsMsg) {
			if l.at.After(last) {
				last, leader = l.at, p
			}
		}
	}
	return leader, leader != nil
}

// leads counts the "coordinator replica leads" lines of procs: one per
// leadership taken.
func leads(procs []*vcluster.Proc) int {
	n := 0
	for _, p := range procs {
		n += len(lines(p, leadsMsg))
	}
	return n
}

// waitNewLeader waits for a replica other than old to lead, and returns it.
func (r *replicatedJob) waitNewLeader(t *testing.T, old *vcluster.Proc) *vcluster.Proc {
	t.Helper()
	var p *vcluster.Proc
	testkit.WaitFor(t, time.Minute, "a new leader", func() bool {
		var ok bool
		p, ok = r.leader()
		return ok && p != old
	})
	return p
}

// resumed waits until every agent's watch stream resumed at the replica
// p after since and returns when the last one did (by p's log), or the zero
// time after d.
func resumedAt(p *vcluster.Proc, agents int, since time.Time, d time.Duration) time.Time {
	for deadline := time.Now().Add(d); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		seen := map[string]time.Time{}
		for _, l := range lines(p, "watch stream resumed") {
			id := nodeIDAttr.FindStringSubmatch(l.rest)
			if id != nil && l.at.After(since) {
				if _, ok := seen[id[1]]; !ok {
					seen[id[1]] = l.at
				}
			}
		}
		if len(seen) >= agents {
			var last time.Time
			for _, at := range seen {
				if at.After(last) {
					last = at
				}
			}
			return last
		}
	}
	return time.Time{}
}

var nodeIDAttr = regexp.MustCompile(` node_id=(\S+)`)

// switched is the agent's line for one leader change (internal/launcher/failover.go).
var switched = regexp.MustCompile(`gotrain: the coordinator's leader moved to (\S+) in [0-9.]+ s \(was (\S*)\)`)

// followed says whether the agent said it follows the leader at addr.
func followed(p *vcluster.Proc, addr string) bool {
	for _, m := range switched.FindAllStringSubmatch(p.Stderr(), -1) {
		if m[1] == addr {
			return true
		}
	}
	return false
}

// finishesOnOneGeneration waits for every agent to exit 0 and checks the
// job ran one generation (no restart, nothing ended) with ranks that agree.
func (r *replicatedJob) finishesOnOneGeneration(t *testing.T, after string) {
	t.Helper()
	for _, p := range r.agents {
		if code, err := p.Wait(4 * time.Minute); err != nil || code != 0 {
			t.Fatalf("%s's agent %s: exit %d, %v\n%s", p.Host.Name, after, code, err, r.c.Dump())
		}
	}
	m := mnistFinal.FindStringSubmatch(r.agents[0].Stdout())
	if m == nil || m[2] != "true" {
		t.Errorf("rank 0's final line %q, want ranks_agree=true", m)
	}
	if gens := r.generations(); len(gens) != 1 {
		t.Errorf("generations' world sizes %v; want one generation %s", gens, after)
	}
	for _, p := range r.agents {
		if ended := logLines(p, "generation ended"); len(ended) > 0 {
			t.Errorf("%s's agent: a generation ended %s: %s", p.Host.Name, after, ended[0].rest)
		}
		if strings.Contains(p.Stderr(), "restarting") {
			t.Errorf("%s's agent restarted workers %s:\n%s", p.Host.Name, after, tail(p.Stderr(), 5))
		}
	}
}

// replicasExit waits for the replicas but skip to exit 0 once the job is
// over, and skip (killed or cut off) to have ended at all.
func (r *replicatedJob) replicasExit(t *testing.T, skip *vcluster.Proc) {
	t.Helper()
	for _, p := range r.replicas {
		code, err := p.Wait(time.Minute)
		switch {
		case err != nil:
			t.Errorf("the replica on %s: %v; its last lines:\n%s", p.Host.Name, err, tail(p.Stderr(), 5))
		case p != skip && code != 0:
			t.Errorf("the replica on %s exited %d; its last lines:\n%s", p.Host.Name, code, tail(p.Stderr(), 5))
		}
	}
	var live []*vcluster.Proc
	for _, p := range r.replicas {
		if p != skip {
			live = append(live, p)
		}
	}
	replicasAgree(t, live, len(live))
}

// stateLine is the line a coordinator replica logs at the job's end, as
// it stops and after 16, 32, 64, ... entries: how many log entries it applied and its state's hash
// (internal/coordinator/state Digest).
var stateLine = regexp.MustCompile(`msg="coordinator replica state" .*at=(\w+) .*applied=(\d+) state_hash=([0-9a-f]+)`)

// replicasAgree checks that the replicas among procs hold the same state
// after the same entries (statesAgree), and that at least one logged its
// state at the job's end.
func replicasAgree(t *testing.T, procs []*vcluster.Proc, want int) {
	t.Helper()
	if finished := statesAgree(t, procs, want); finished < 1 {
		t.Errorf("no replica logged its state at the job's end")
	}
}

// statesAgree checks that every state line among procs of as many entries
// applied has one hash, and that at least min(want, 2) replicas logged a
// state after the same number of entries. It returns how many logged
// their state at the job's end.
func statesAgree(t *testing.T, procs []*vcluster.Proc, want int) (finished int) {
	t.Helper()
	byApplied := map[string]map[string][]string{} // applied -> hash -> who
	for _, p := range procs {
		fin := false
		for _, m := range stateLine.FindAllStringSubmatch(p.Stderr(), -1) {
			if byApplied[m[2]] == nil {
				byApplied[m[2]] = map[string][]string{}
			}
			byApplied[m[2]][m[3]] = append(byApplied[m[2]][m[3]], p.Host.Name+" at "+m[1])
			fin = fin || m[1] == "finished"
		}
		if fin {
			finished++
		}
	}
	// A follower may stop (its agent exits with the job) before it applies
	// the log's last entries, so the end is only the leader's for sure;
	// states are compared where replicas applied as many entries (every
	// replica logs one after 16, 32, 64, ... entries), and at least
	// min(want, 2) replicas must meet at one such count, or the check
	// compared nothing.
	met := 0
	for applied, hashes := range byApplied {
		if len(hashes) > 1 {
			t.Errorf("the replicas' states after %s entries differ: by hash %v", applied, hashes)
		}
		hosts := map[string]bool{}
		for _, who := range hashes {
			for _, w := range who {
				hosts[strings.Fields(w)[0]] = true
			}
		}
		met = max(met, len(hosts))
	}
	if met < min(want, 2) {
		t.Errorf("no %d replicas applied the same number of entries, so none could be compared", min(want, 2))
	}
	t.Logf("replica states by entries applied: %v", byApplied)
	return finished
}

// agentReplicasAgree checks, after a test, that the coordinator replicas
// its agents hosted agree (statesAgree): only a replicated coordinator
// logs state lines, and a test whose agents logged none had no replicas
// (or ran without --verbose). Registered by startJobOn, so every
// replicated cluster test runs it; the job's end is not required (a test
// may stop with the job running).
func (j *job) agentReplicasAgree(t *testing.T) {
	if t.Failed() {
		return // the failure is the news; a job cut short may not have met
	}
	for _, p := range j.agents {
		if stateLine.MatchString(p.Stderr()) {
			statesAgree(t, j.agents, 2)
			return
		}
	}
}

// failoverOnly: with $GOTRAIN_BENCH_FAILOVER set (bench/coordinator_failover.sh),
// a test ends once the failover is measured, logging the leaderships taken
// so far.
func failoverOnly(t *testing.T, r *replicatedJob) bool {
	if os.Getenv("GOTRAIN_BENCH_FAILOVER") == "" {
		return false
	}
	t.Logf("TIMING leader changes: %d leaderships taken (2 expected: the first leader, its successor)", leads(r.replicas))
	return true
}

// replicatedMNIST is the training of the standalone tests: long enough
// (30 s and more on 2 cores: 2.3 s an epoch) to outlast a failover by far.
func replicatedMNIST() []string {
	return []string{bin.mnist, "--data", bin.data, "--epochs", "12"}
}

// loseLeader starts the standalone tests' job, and once it trains strikes
// the leader replica's host with fault (what and after name it in the
// TIMING line): another replica leads, and every agent's stream resumes
// there. It returns the job, the old and the new leader, and when the
// fault struck.
func loseLeader(t *testing.T, what, after string, fault func(*vcluster.Host)) (r *replicatedJob, old, nl *vcluster.Proc, at time.Time) {
	t.Helper()
	r = startReplicatedJob(t, 2, []string{"--verbose", "--max-restarts", "0"}, replicatedMNIST()...)
	r.running(t)
	old, _ = r.leader()
	at = time.Now()
	fault(old.Host)
	nl = r.waitNewLeader(t, old)
	led := lines(nl, leadsMsg)
	served := resumedAt(nl, len(r.agents), at, time.Minute)
	if served.IsZero() {
		t.Errorf("the new leader on %s logged no resumed watch stream for every agent:\n%s", nl.Host.Name, tail(nl.Stderr(), 20))
	} else {
		t.Logf("TIMING leader %s: a new leader (%s) %v after %s; every agent's stream resumed there %v after it",
			what, nl.Host.Name, led[len(led)-1].at.Sub(at).Round(time.Millisecond), after, served.Sub(at).Round(time.Millisecond))
	}
	chaosLine(t, since(at, led[len(led)-1].at), since(at, served)) // faults_test.go
	return r, old, nl, at
}

// followNewLeader checks that every agent said it follows nl, in one line
// for the one failover (no lines flipping between replicas, no Raft terms).
func (r *replicatedJob) followNewLeader(t *testing.T, nl *vcluster.Proc) {
	t.Helper()
	for _, p := range r.agents {
		if !followed(p, nl.Host.IP+":"+replicaPort) {
			t.Errorf("%s's agent never said it follows the new leader at %s:%s:\n%s", p.Host.Name, nl.Host.IP, replicaPort, tail(p.Stderr(), 10))
		}
		if l := switched.FindAllString(p.Stderr(), -1); len(l) != 1 {
			t.Errorf("%s's agent printed %d leader lines for one failover, want 1:\n%s", p.Host.Name, len(l), tail(p.Stderr(), 20))
		} else {
			t.Logf("TIMING %s: %s", p.Host.Name, l[0])
		}
	}
}

// TestReplicatedLeaderKilled: three standalone replicas serve a 2-node
// MNIST job; the leader is SIGKILLed mid-training: another replica leads,
// both agents follow it, and the job finishes with one generation, no
// restart and ranks that agree; every replica exits.
func TestReplicatedLeaderKilled(t *testing.T) {
	t.Parallel()
	r, old, nl, _ := loseLeader(t, "SIGKILL", "the kill", (*vcluster.Host).Kill)
	if failoverOnly(t, r) {
		return
	}
	r.finishesOnOneGeneration(t, "after the leader replica was killed")
	r.followNewLeader(t, nl)
	r.replicasExit(t, old)
	t.Logf("TIMING leader changes: %d leaderships taken (2 expected: the first leader, its successor)", leads(r.replicas))
	if t.Failed() {
		t.Log(r.c.Dump())
	}
}

// TestReplicatedLeaderPartitioned: as TestReplicatedLeaderKilled, but the
// leader's host is cut off both ways: the same outcome, and the cut-off
// replica ends too (it is healed once the job is over).
func TestReplicatedLeaderPartitioned(t *testing.T) {
	t.Parallel()
	r, old, nl, cut := loseLeader(t, "partition", "the cut", func(h *vcluster.Host) { h.Partition(vcluster.Both) })
	if failoverOnly(t, r) {
		return
	}
	r.finishesOnOneGeneration(t, "after the leader replica was cut off")
	r.followNewLeader(t, nl)
	// The cut-off replica stops on its own (no majority for long), or
	// learns the end once it hears from the others.
	old.Host.Heal()
	r.replicasExit(t, old)
	t.Logf("TIMING the cut-off replica on %s exited %v after the cut: %s", old.Host.Name, old.Ended.Sub(cut).Round(time.Millisecond), tail(old.Stderr(), 1))
	t.Logf("TIMING leader changes: %d leaderships taken (2 expected: the first leader, its successor)", leads(r.replicas))
	if t.Failed() {
		t.Log(r.c.Dump())
	}
}

// TestReplicatedNoMajority: two of the three replicas are SIGKILLed
// mid-training, the leader among them: the job cannot go on, and every
// agent exits non-zero with a report that says there is no majority.
func TestReplicatedNoMajority(t *testing.T) {
	t.Parallel()
	r := startReplicatedJob(t, 2, []string{"--verbose", "--max-restarts", "0"}, replicatedMNIST()...)
	r.running(t)
	old, _ := r.leader()
	var survivor *vcluster.Proc
	killed := time.Now()
	old.Host.Kill()
	for _, p := range r.replicas {
		if p == old {
			continue
		}
		if survivor == nil {
			survivor = p
			continue
		}
		p.Host.Kill()
	}
	for _, p := range r.agents {
		code, err := p.Wait(2 * time.Minute)
		if err != nil {
			t.Fatalf("%v\n%s", err, r.c.Dump())
		}
		if code == 0 {
			t.Errorf("%s's agent exited 0 without a majority of the replicas", p.Host.Name)
		}
		if last := tail(p.Stderr(), 3); !strings.Contains(last, "no majority") {
			t.Errorf("%s's agent's report does not say there is no majority; its last lines:\n%s", p.Host.Name, last)
		}
	}
	t.Logf("TIMING no majority: the last agent exited %v after the kills: %s", lastEnd(r.job, nil).Sub(killed).Round(time.Millisecond), tail(r.agents[0].Stderr(), 1))
	// The surviving replica stops too, saying why.
	code, err := survivor.Wait(2 * time.Minute)
	if err != nil || code == 0 || !strings.Contains(tail(survivor.Stderr(), 2), "no majority") {
		t.Errorf("the surviving replica on %s: exit %d, %v; want it to stop, saying there is no majority:\n%s", survivor.Host.Name, code, err, tail(survivor.Stderr(), 3))
	} else {
		t.Logf("TIMING no majority: the surviving replica exited %v after the kills", survivor.Ended.Sub(killed).Round(time.Millisecond))
	}
	if t.Failed() {
		t.Log(r.c.Dump())
	}
}

// TestEmbeddedReplicatedNodeZeroKilled: 4 nodes with --nnodes 3:4, the
// coordinator embedded and replicated (node 1's agent runs the first
// replica, the next two nodes to join host the others); node 1's agent,
// the leader's host, is SIGKILLed mid-training: a hosted replica takes the
// lead, and the job goes on on the 3 survivors and finishes with ranks
// that agree.
func TestEmbeddedReplicatedNodeZeroKilled(t *testing.T) {
	t.Parallel()
	ckpt := t.TempDir()
	j := startElasticJob(t, 4, "3:4", []string{"--verbose", "--grace-period", "2s", "--join-settle", "1s"},
		bin.mnist, "--data", bin.data, "--epochs", "15", "--checkpoint-dir", ckpt)
	j.running(t)
	var hosting []*vcluster.Proc
	testkit.WaitFor(t, time.Minute, "two nodes hosting a replica", func() bool {
		hosting = hosting[:0]
		for _, p := range j.agents[1:] {
			if strings.Contains(p.Stderr(), "gotrain: this node hosts a replica of the coordinator at ") {
				hosting = append(hosting, p)
			}
		}
		return len(hosting) == 2
	})
	victim := j.c.Hosts[0]
	killed := time.Now()
	victim.Kill()
	survivors := j.agents[1:]
	var nl *vcluster.Proc
	testkit.WaitFor(t, time.Minute, "a new leader on a node hosting a replica", func() bool {
		for _, p := range hosting {
			for _, l := range lines(p, leadsMsg) {
				if l.at.After(killed) {
					nl = p
					return true
				}
			}
		}
		return false
	})
	led := lines(nl, leadsMsg)
	t.Logf("TIMING embedded leader lost with its node: %s's replica leads %v after the SIGKILL", nl.Host.Name, led[len(led)-1].at.Sub(killed).Round(time.Millisecond))
	for _, l := range lines(nl, "node lost") {
		if l.at.After(killed) {
			t.Logf("TIMING embedded: the new leader declared a node lost %v after the SIGKILL:%s", l.at.Sub(killed).Round(time.Millisecond), l.rest)
			break
		}
	}
	for _, p := range survivors {
		if code, err := p.Wait(4 * time.Minute); err != nil || code != 0 {
			t.Fatalf("%s's agent: exit %d, %v\n%s", p.Host.Name, code, err, j.c.Dump())
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
	// The replica lost with node 1 is replaced: the survivor that hosted
	// none is asked to host one, so the set is 3 again.
	replaced := false
	for _, p := range survivors {
		if !slices.Contains(hosting, p) && strings.Contains(p.Stderr(), "gotrain: this node hosts a replica of the coordinator at ") {
			replaced = true
			t.Logf("the lost replica was replaced on %s", p.Host.Name)
		}
	}
	if !replaced {
		t.Errorf("no survivor took the place of the replica lost with %s", victim.Name)
	}
	replicasAgree(t, survivors, 2)
	gens := generationsOf(nl)
	if len(gens) < 2 || gens[0] != 4 || gens[len(gens)-1] != 3 {
		t.Errorf("%s's generations' world sizes %v; want 4, then 3", nl.Host.Name, gens)
	}
	if at := generationAfterOn(nl, 3, killed); !at.IsZero() {
		t.Logf("TIMING embedded: the 3-node generation started %v after the SIGKILL; world sizes %v", at.Sub(killed).Round(time.Millisecond), gens)
	}
	if t.Failed() {
		t.Log(j.c.Dump())
	}
}

// generationsOf are the world sizes of the generations p's agent started.
func generationsOf(p *vcluster.Proc) []int {
	return (&job{agents: []*vcluster.Proc{p}}).generations()
}

// generationAfterOn is when p's agent started the first generation of
// world size ws after t.
func generationAfterOn(p *vcluster.Proc, ws int, t time.Time) time.Time {
	return (&job{agents: []*vcluster.Proc{p}}).generationAfter(ws, t)
}
