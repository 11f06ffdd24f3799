package job_test

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gotrain/gotrain/internal/coordinator/job"
)

// trainer drives a machine like a data-parallel job: one all-reduce per
// step on comm "grads", every rank finishing it when the slowest has
// computed (slow says how long a rank computes in a generation), reported
// every second. Agents stop every worker when a generation ends. Time is
// the trainer's clock; nothing sleeps.
type trainer struct {
	t     *testing.T
	m     *job.Machine
	now   time.Time
	slow  func(gen int64, rank int) bool
	gen   int64
	world []string // node id of each rank
	seq   int64
	at    time.Time // when collective seq completed
	waits []time.Duration
	acts  []job.Action // every action so far
}

const (
	fastStep = 300 * time.Millisecond
	slowStep = 700 * time.Millisecond
)

func newTrainer(t *testing.T, cfg job.Config, hosts []string, nproc int, slow func(gen int64, rank int) bool) *trainer {
	t.Helper()
	cfg.RunID = "run-1"
	m, err := job.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	tr := &trainer{t: t, m: m, now: transcriptT0, slow: slow, gen: -1}
	for i, h := range hosts {
		tr.step(job.NodeJoined{NodeID: "n" + h, Host: i == 0, NodeRank: i,
			Info: job.NodeInfo{Hostname: h, Address: h, Nproc: nproc, FreePort: 29500, AgentPID: 100 + i}})
	}
	if len(hosts) < cfg.Nodes { // elastic: the joins settle
		tr.now = tr.now.Add(job.DefaultJoinSettle)
		tr.step(job.Tick{})
	}
	if tr.gen != 0 {
		t.Fatalf("generation 0 did not start: %v", tr.acts)
	}
	return tr
}

// step steps ev and follows up what the agents would: a new generation's
// ranks start at step 0, an ended generation's workers are stopped.
func (tr *trainer) step(ev job.Event) []job.Action {
	tr.t.Helper()
	acts, err := tr.m.Step(tr.now, ev)
	if err != nil {
		tr.t.Fatalf("step %T: %v", ev, err)
	}
	tr.acts = append(tr.acts, acts...)
	for _, a := range acts {
		switch a := a.(type) {
		case job.StartGeneration:
			tr.gen, tr.seq, tr.at, tr.world = a.Generation, 0, tr.now, nil
			for _, n := range a.Nodes {
				for range n.Ranks {
					tr.world = append(tr.world, n.NodeID)
				}
			}
			tr.waits = make([]time.Duration, a.WorldSize)
		case job.EndGeneration:
			for r, id := range tr.world {
				if tr.m.HasNode(id) {
					tr.step(job.WorkerExited{NodeID: id, Generation: a.Generation, Rank: r, Pid: pidOf(a.Generation, r), Signal: "SIGTERM", Stopped: true})
				}
			}
		}
	}
	return acts
}

func pidOf(gen int64, rank int) int { return 1000 + 100*int(gen) + rank }

// run trains for d, reporting and ticking every second.
func (tr *trainer) run(d time.Duration) {
	tr.t.Helper()
	for end := tr.now.Add(d); tr.now.Before(end) && !tr.m.Finished(); {
		tr.now = tr.now.Add(time.Second)
		step := fastStep
		for r := range tr.world {
			if tr.slow(tr.gen, r) {
				step = slowStep
			}
		}
		for !tr.at.Add(step).After(tr.now) {
			tr.at, tr.seq = tr.at.Add(step), tr.seq+1
			for r := range tr.world {
				compute := fastStep
				if tr.slow(tr.gen, r) {
					compute = slowStep
				}
				tr.waits[r] += step - compute + 10*time.Millisecond
			}
		}
		byNode := map[string][]job.Progress{}
		for r, id := range tr.world {
			byNode[id] = append(byNode[id], job.Progress{Rank: r, Generation: tr.gen, Step: tr.seq, Time: tr.now, Pid: pidOf(tr.gen, r), ProcState: "S",
				Comms: []job.CommProgress{{Comm: "grads", EnteredSeq: tr.seq, CompletedSeq: tr.seq, CompletedTime: tr.at, Wait: tr.waits[r]}}})
		}
		for _, id := range slices.Sorted(mapKeys(byNode)) {
			if tr.m.HasNode(id) {
				tr.step(job.ProgressReported{NodeID: id, Ranks: byNode[id]})
			}
		}
		tr.step(job.Tick{})
	}
}

func mapKeys[V any](m map[string]V) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// of returns the actions of type T so far.
func of[T job.Action](acts []job.Action) []T {
	var out []T
	for _, a := range acts {
		if a, ok := a.(T); ok {
			out = append(out, a)
		}
	}
	return out
}

// stragglerLines are the summaries of the straggler verdicts reported.
func stragglerLines(acts []job.Action) []string {
	var out []string
	for _, h := range of[job.HangDetected](acts) {
		if h.Verdict.Kind == job.VerdictStraggler {
			out = append(out, h.Verdict.Summary)
		}
	}
	return out
}

func slowIn(gen int64, slowRank int) func(int64, int) bool {
	return func(g int64, r int) bool { return r == slowRank && (gen < 0 || g == gen) }
}

func TestStragglerReportOnly(t *testing.T) {
	tr := newTrainer(t, job.Config{}, []string{"a"}, 3, slowIn(-1, 2))
	tr.run(2 * time.Minute)
	if got := stragglerLines(tr.acts); len(got) != 1 || !strings.HasPrefix(got[0], "rank 2 on host a is the straggler") {
		t.Fatalf("straggler verdicts %q; want rank 2 named once", got)
	}
	if ends := of[job.EndGeneration](tr.acts); len(ends) != 0 {
		t.Errorf("--on-straggler report ended the generation: %+v", ends)
	}
}

func TestStragglerReplaceRank(t *testing.T) {
	// Restarts are off: a replacement is not a restart, so the job goes on.
	cfg := job.Config{OnStraggler: job.OnStragglerReplace, StragglerPersist: 10 * time.Second}
	tr := newTrainer(t, cfg, []string{"a"}, 3, slowIn(0, 2))
	tr.run(15 * time.Second)
	named := tr.m.Verdicts()
	if len(named) != 1 || named[0].Kind != job.VerdictStraggler {
		t.Fatalf("verdicts %v; want the straggler named", named)
	}
	if ends := of[job.EndGeneration](tr.acts); len(ends) != 0 {
		t.Fatalf("replaced %s after it was named, before StragglerPersist: %+v", tr.now.Sub(named[0].Since), ends)
	}
	tr.run(time.Minute)
	ends := of[job.EndGeneration](tr.acts)
	if len(ends) != 1 {
		t.Fatalf("generation ends %+v; want one, the replacement", ends)
	}
	e := ends[0]
	if e.Generation != 0 || !slices.Equal(e.Replace, []int{2}) || e.Failure == nil || e.Failure.Rank != 2 || e.Failure.Hostname != "a" ||
		!strings.HasPrefix(e.Failure.Reason, "straggler: rank 2 on host a is the straggler") ||
		!strings.HasPrefix(e.Reason, "replacing rank 2 on host a, the straggler for 10s (--on-straggler replace): ") {
		t.Errorf("EndGeneration %+v (failure %+v)", e, e.Failure)
	}
	starts := of[job.StartGeneration](tr.acts)
	if len(starts) != 2 || starts[1].Generation != 1 || starts[1].RestartCount != 0 || starts[1].Nodes[0].Ranks[2].Survivor {
		t.Fatalf("generations %+v; want generation 1 at restart count 0, rank 2 started afresh", starts)
	}
	if st := tr.m.Status(); st.State != job.StateRunning || st.Generation != 1 || len(st.Verdicts) != 0 {
		t.Errorf("status %s generation %d verdicts %v; want generation 1 running clean", st.State, st.Generation, st.Verdicts)
	}
}

func TestStragglerReplaceDidNotHelp(t *testing.T) {
	cfg := job.Config{OnStraggler: job.OnStragglerReplace, StragglerPersist: 10 * time.Second, MaxRestarts: 5}
	tr := newTrainer(t, cfg, []string{"a"}, 3, slowIn(-1, 2)) // slow in every generation: the host
	tr.run(3 * time.Minute)
	if ends := of[job.EndGeneration](tr.acts); len(ends) != 1 {
		t.Fatalf("generation ends %+v; want one replacement, then none within the cool-down", ends)
	}
	lines := stragglerLines(tr.acts)
	var notes int
	for _, l := range lines {
		if strings.Contains(l, "replacing rank 2 on host a") && strings.Contains(l, "did not help, so it is not replaced again: the cause is likely the GPU or the host") {
			notes++
		}
	}
	if notes != 1 {
		t.Errorf("straggler verdicts %q; want one saying the replacement did not help", lines)
	}
	if st := tr.m.Status(); st.State != job.StateRunning || st.RestartCount != 0 {
		t.Errorf("status %s restarts %d; want the job running, no restart counted", st.State, st.RestartCount)
	}
	if vs := tr.m.Verdicts(); len(vs) != 1 || !strings.Contains(vs[0].Summary, "did not help") {
		t.Errorf("verdicts in force %v; want the straggler, with the note", vs)
	}

	// After the cool-down a straggler is a new slowdown, worth a new try.
	tr.run(job.DefaultStragglerCooldown)
	if ends := of[job.EndGeneration](tr.acts); len(ends) != 2 {
		t.Errorf("generation ends after the cool-down: %d; want a second replacement", len(ends))
	}
}

func TestStragglerDropNode(t *testing.T) {
	cfg := job.Config{Nodes: 3, MinNodes: 2, OnStraggler: job.OnStragglerReplace, StragglerPersist: 10 * time.Second}
	tr := newTrainer(t, cfg, []string{"a", "b", "c"}, 1, slowIn(0, 2)) // rank 2 is node c's
	tr.run(time.Minute)
	drops := of[job.DropNode](tr.acts)
	if len(drops) != 1 || drops[0].NodeID != "nc" || drops[0].Hostname != "c" ||
		!strings.HasPrefix(drops[0].Reason, "rank 2 on host c dropped as a persistent straggler (the straggler for 10s, --on-straggler replace): ") ||
		!strings.HasSuffix(drops[0].Reason, "the job goes on on its other 2 nodes (--nnodes 2:3)") {
		t.Fatalf("DropNode %+v; want node c dropped", drops)
	}
	if ends := of[job.EndGeneration](tr.acts); len(ends) != 1 || !slices.Equal(ends[0].Replace, []int{2}) ||
		!strings.HasPrefix(ends[0].Reason, "node nc on c (c, agent pid 102; rank 2) was lost: straggler: rank 2 on host c dropped as a persistent straggler") {
		t.Errorf("generation ends %+v", ends)
	}
	if tr.m.HasNode("nc") {
		t.Error("the machine still has the dropped node")
	}
	starts := of[job.StartGeneration](tr.acts)
	if len(starts) != 2 || starts[1].WorldSize != 2 || starts[1].RestartCount != 0 {
		t.Fatalf("generations %+v; want generation 1 on the 2 other nodes, no restart counted", starts)
	}
	if st := tr.m.Status(); st.State != job.StateRunning || st.Failure == nil || !strings.HasPrefix(st.Failure.Reason, "straggler: rank 2 on host c dropped") {
		t.Errorf("status %s failure %+v", st.State, st.Failure)
	}
}

func TestStragglerReplaceNotDropped(t *testing.T) {
	for _, tc := range []struct {
		name  string
		hosts []string
		slow  int
	}{
		// At its minimum the job cannot lose a node: the rank is replaced.
		{"at the minimum", []string{"a", "b"}, 1},
		// The first node's agent runs the coordinator: dropping it would
		// end the job's coordinator.
		{"the coordinator's node", []string{"a", "b", "c"}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := job.Config{Nodes: 3, MinNodes: 2, OnStraggler: job.OnStragglerReplace, StragglerPersist: 10 * time.Second}
			tr := newTrainer(t, cfg, tc.hosts, 1, slowIn(0, tc.slow))
			tr.run(time.Minute)
			if drops := of[job.DropNode](tr.acts); len(drops) != 0 {
				t.Fatalf("dropped %+v", drops)
			}
			ends := of[job.EndGeneration](tr.acts)
			if len(ends) != 1 || !slices.Equal(ends[0].Replace, []int{tc.slow}) {
				t.Fatalf("generation ends %+v; want rank %d replaced", ends, tc.slow)
			}
			if st := tr.m.Status(); st.State != job.StateRunning || len(st.Nodes) != len(tc.hosts) {
				t.Errorf("status %s on %d nodes", st.State, len(st.Nodes))
			}
		})
	}
}

func TestStragglerConfig(t *testing.T) {
	_, err := job.New(job.Config{RunID: "r", OnStraggler: "restart"})
	if err == nil || !strings.Contains(err.Error(), `on straggler is "restart": use "report" or "replace"`) {
		t.Errorf("New with OnStraggler restart: %v", err)
	}
	m, err := job.New(job.Config{RunID: "r"})
	if err != nil {
		t.Fatal(err)
	}
	if c := m.Config(); c.OnStraggler != job.OnStragglerReport || c.StragglerPersist != job.DefaultStragglerPersist || c.StragglerCooldown != job.DefaultStragglerCooldown {
		t.Errorf("defaults %q %s %s", c.OnStraggler, c.StragglerPersist, c.StragglerCooldown)
	}
}
