package worker

import (
	"fmt"
	"strings"

	"github.com/gotrain/gotrain/internal/jobenv"
	"github.com/gotrain/gotrain/internal/jobenv/genwire"
	gotrainv1 "github.com/gotrain/gotrain/proto/gotrain/v1"
)

// A process becomes a rank's worker in one of three ways: started for it
// (the agent put jobenv.Identity's variables in its environment), a standby
// handed the rank (standby.go), or a survivor handed the next generation
// (recover.go). The last two build the identity with the same
// jobenv.Identity from the same generation and adopt it here, so that every
// worker of a rank sees the same variables in its environment and in
// Worker's fields, whichever way it came.

// adoptIdentity sets v's variables in the process's environment (code that
// reads RANK, WORLD_SIZE, GOTRAIN_* later sees what a worker started for
// the rank sees) and unsets a standby's own.
func adoptIdentity(v jobenv.Vars, setenv func(k, val string) error, unsetenv func(k string) error) error {
	for _, kv := range v.Environ() {
		k, val, _ := strings.Cut(kv, "=")
		if err := setenv(k, val); err != nil {
			return fmt.Errorf("set %s: %w", k, err)
		}
	}
	for _, k := range []string{jobenv.Standby, jobenv.StandbySlot} {
		if err := unsetenv(k); err != nil {
			return fmt.Errorf("unset %s: %w", k, err)
		}
	}
	return nil
}

// setVars makes v this worker's identity: its exported fields and vars.
func (w *Worker) setVars(v jobenv.Vars) {
	w.Rank, w.WorldSize = v.Rank, v.WorldSize
	w.LocalRank, w.LocalWorldSize = v.LocalRank, v.LocalWorldSize
	w.GroupRank, w.Generation, w.RestartCount = v.GroupRank, v.Generation, v.RestartCount
	w.Backend, w.GPU = v.Backend, v.GPU
	w.vars = v
}

// adoptGeneration makes generation s this surviving worker's: the same
// identity, environment included, as a process started for its rank in s.
// A process lives in its node's local slot: its rank is the one of its
// local rank in s, which changes when the job shrinks or grows.
// Run passes os.Setenv and os.Unsetenv.
func (w *Worker) adoptGeneration(s *gotrainv1.GenerationStarted, setenv func(k, val string) error, unsetenv func(k string) error) error {
	g := genwire.Generation(s)
	rank, ok := g.RankAt(w.LocalRank)
	if !ok {
		return fmt.Errorf("worker: local rank %d (rank %d) is not in generation %d on this node", w.LocalRank, w.Rank, s.GetGeneration())
	}
	v, _ := jobenv.Identity(g, rank, w.vars.Node())
	if err := adoptIdentity(v, setenv, unsetenv); err != nil {
		return fmt.Errorf("worker: rank %d: %w", w.Rank, err)
	}
	w.setVars(v)
	if w.diag != nil {
		w.diag.setGeneration(w.Generation, w.Rank)
	}
	return nil
}
