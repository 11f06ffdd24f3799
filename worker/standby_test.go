package worker

import (
	"maps"
	"strings"
	"testing"

	"github.com/gotrain/gotrain/internal/jobenv"
	"github.com/gotrain/gotrain/internal/jobenv/genwire"
	gotrainv1 "github.com/gotrain/gotrain/proto/gotrain/v1"
)

// fakeEnv is a process environment for adoptIdentity.
type fakeEnv map[string]string

func envOf(kvs []string) fakeEnv {
	e := fakeEnv{}
	for _, kv := range kvs {
		k, v, _ := strings.Cut(kv, "=")
		e[k] = v
	}
	return e
}

func (e fakeEnv) set(k, v string) error { e[k] = v; return nil }
func (e fakeEnv) unset(k string) error  { delete(e, k); return nil }

var testNode = jobenv.Node{AgentSocket: "/tmp/a.sock", JobToken: "tok", RunID: "run", Backend: "cpu", Host: "10.0.0.1"}

// gen is generation n of a job whose node runs ranks 2 and 3.
func gen(n int64, restarts int, survivor bool) *gotrainv1.GenerationStarted {
	return &gotrainv1.GenerationStarted{Generation: n, WorldSize: 4, GroupRank: 1, RestartCount: int32(restarts),
		MasterAddr: "10.0.0.9", MasterPort: int32(29500 + n),
		Ranks: []*gotrainv1.RankAssignment{{Rank: 2, LocalRank: 0, Gpu: -1, Survivor: survivor}, {Rank: 3, LocalRank: 1, Gpu: -1}}}
}

// freshEnv is the environment the agent gives a process started for rank in g.
func freshEnv(t *testing.T, g *gotrainv1.GenerationStarted, rank int) fakeEnv {
	t.Helper()
	v, ok := jobenv.Identity(genwire.Generation(g), rank, testNode)
	if !ok {
		t.Fatalf("rank %d not in generation %d", rank, g.GetGeneration())
	}
	env := envOf(v.Environ())
	env["HOME"] = "/root"
	return env
}

func TestASurvivorsEnvironmentEqualsAFreshWorkers(t *testing.T) {
	env := freshEnv(t, gen(1, 0, false), 2)
	v, err := jobenv.FromEnv(func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	w := &Worker{}
	w.setVars(v)
	next := gen(2, 1, true)
	if err := w.adoptGeneration(next, env.set, env.unset); err != nil {
		t.Fatal(err)
	}
	want := freshEnv(t, next, 2)
	if !maps.Equal(env, want) {
		t.Errorf("survivor's environment\n%v\nwant a fresh worker's\n%v", env, want)
	}
	fresh, _ := jobenv.FromEnv(func(k string) string { return want[k] })
	if w.vars != fresh || w.Generation != 2 || w.RestartCount != 1 || w.LocalWorldSize != 2 {
		t.Errorf("survivor's identity %+v, want %+v", w.vars, fresh)
	}
}

func TestAStandbysEnvironmentEqualsAFreshWorkers(t *testing.T) {
	sv := jobenv.StandbyVars{Slot: 1, AgentSocket: testNode.AgentSocket, JobToken: testNode.JobToken, RunID: testNode.RunID,
		Backend: testNode.Backend, Host: testNode.Host, GPU: -1}
	env := envOf(sv.Environ())
	env["HOME"] = "/root"
	g := gen(3, 2, false)
	v, ok := jobenv.Identity(genwire.Generation(g), 3, sv.Node())
	if !ok {
		t.Fatal("rank 3 not found")
	}
	if err := adoptIdentity(v, env.set, env.unset); err != nil {
		t.Fatal(err)
	}
	if want := freshEnv(t, g, 3); !maps.Equal(env, want) {
		t.Errorf("standby's environment\n%v\nwant a fresh worker's\n%v", env, want)
	}
}

// A survivor keeps its node's local slot; when the job shrinks its rank
// changes, and it takes the rank of its local rank, as a fresh worker of
// that slot would.
func TestASurvivorTakesTheRankOfItsSlotWhenTheJobShrinks(t *testing.T) {
	env := freshEnv(t, gen(1, 0, false), 3) // rank 3, local rank 1, of 4
	v, err := jobenv.FromEnv(func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	w := &Worker{}
	w.setVars(v)
	smaller := &gotrainv1.GenerationStarted{Generation: 2, WorldSize: 2, GroupRank: 0, RestartCount: 1, MasterAddr: "10.0.0.9", MasterPort: 29502,
		Ranks: []*gotrainv1.RankAssignment{{Rank: 0, LocalRank: 0, Gpu: -1, Survivor: true}, {Rank: 1, LocalRank: 1, Gpu: -1, Survivor: true}}}
	if err := w.adoptGeneration(smaller, env.set, env.unset); err != nil {
		t.Fatal(err)
	}
	if w.Rank != 1 || w.WorldSize != 2 || w.LocalRank != 1 {
		t.Errorf("survivor is rank %d of %d (local %d); want rank 1 of 2, local 1", w.Rank, w.WorldSize, w.LocalRank)
	}
	if want := freshEnv(t, smaller, 1); !maps.Equal(env, want) {
		t.Errorf("survivor's environment\n%v\nwant a fresh worker's\n%v", env, want)
	}
}
