package launcher

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/gotrain/gotrain/internal/nodehealth"
	"github.com/gotrain/gotrain/internal/preflight"
	gotrainv1 "github.com/gotrain/gotrain/proto/gotrain/v1"
	"github.com/gotrain/gotrain/worker/comm"
)

// The gang check (internal/preflight/gangrun.go) runs when a generation
// with a node new to it starts — the job's first, or one an elastic job
// grew in (a replacement) — before its ranks do: every node passed its own
// checks by then (a node that did not stayed out, or failed the job at its
// join).

// gangDue says whether the gang check runs before generation g's ranks
// start: g has a node this node did not start a generation with before
// (every node of g, new or not, finds the same: the new node's own first
// generation). It remembers g's nodes.
func (a *agent) gangDue(g *gotrainv1.GenerationStarted) bool {
	if a.gangExit != nil {
		return false
	}
	var ids []string
	for _, n := range g.GetNodes() {
		ids = append(ids, n.GetNodeId())
	}
	first := a.gangSeen == nil
	due := first
	for _, id := range ids {
		due = due || !slices.Contains(a.gangSeen, id)
	}
	a.gangSeen = ids
	return due
}

// gangCheck runs the gang check for generation g, of at least two nodes,
// with preflight on. It returns an *ExitError when this node must not
// start its ranks: it failed and stays out, or the job cannot start.
func (a *agent) gangCheck(ctx context.Context, g *gotrainv1.GenerationStarted) error {
	p := a.cfg.Preflight
	if p == nil || len(g.GetNodes()) < 2 {
		return nil
	}
	me, ok := a.gangPlace(g)
	if !ok {
		return nil
	}
	nodes := me.Nodes
	me.Hosts = a.gangHosts(ctx, me.Nodes)
	cfg := preflight.QuickGang
	if p.Level == preflight.Full {
		cfg = preflight.FullGang
	}
	a.setPhase(ctx, fmt.Sprintf("preflight (%s): the gang check of %d nodes", p.Level, len(nodes)))
	start := time.Now()
	v, err := preflight.Gang(ctx, cfg, me, kvStore{a.coord})
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if err != nil {
		fmt.Fprintf(a.cfg.Stderr, "gotrain: warning: the preflight gang check could not run on %s: %v; the job starts without it\n", a.host, err)
		return nil
	}
	took := time.Since(start)
	if v.Passed {
		fmt.Fprintf(a.cfg.Stderr, "gotrain: preflight (%s): the gang check of %d nodes passed in %.1f s: %s\n", p.Level, len(nodes), took.Seconds(), v.Summary())
		return nil
	}
	return a.gangOutcome(v, me)
}

// gangOutcome says the failed gang check's verdict v and decides this
// node's part: it stays out, the job goes on without the nodes named, or
// the job does not start.
func (a *agent) gangOutcome(v preflight.GangVerdict, me preflight.GangNode) error {
	p := a.cfg.Preflight
	elastic := a.jobElastic()
	if a.cfg.Nodes <= 1 {
		elastic = v.Elastic // this node does not know the job's --nnodes: the leader's word
	}
	goesOn := elastic && len(v.Out) > 0
	sched := preflight.Scheduler{Slurm: p.Slurm, Elastic: goesOn}
	for _, x := range v.Out {
		// Every node says who is out: a node that never joined cannot.
		fmt.Fprintln(a.cfg.Stderr, preflight.Line(x, sched))
	}
	if len(v.Out) == 0 {
		for _, x := range v.Gang {
			if !x.OK {
				fmt.Fprintln(a.cfg.Stderr, preflight.Line(x, sched))
			}
		}
	}
	mine := v.IsOut(a.nodeID)
	if mine && p.Ledger != nil {
		for _, x := range v.Out {
			if x.Node == me.Hosts[me.Index] || x.Node == a.nodeID {
				a.appendVerdict(nodehealth.Preflight, string(x.Check), x.Measured+" (expected "+x.Expected+")")
			}
		}
	}
	names := make([]string, 0, len(v.Out))
	for _, x := range v.Out {
		names = append(names, x.Node)
	}
	switch {
	case mine && goesOn && a.cfg.Coordinator != "":
		return &ExitError{Code: preflight.ExitStatus, Message: fmt.Sprintf("gotrain: this node (%s) failed the preflight gang check and stays out of the job, which goes on without it (--nnodes MIN:MAX); exit status %d", a.host, preflight.ExitStatus)}
	case goesOn && !mine:
		fmt.Fprintf(a.cfg.Stderr, "gotrain: preflight: the job goes on without %s (--nnodes MIN:MAX)\n", strings.Join(names, ", "))
		return nil
	case len(names) == 0:
		return &ExitError{Code: preflight.ExitStatus, Message: fmt.Sprintf("gotrain: the preflight gang check failed with no one node to blame (the network between the nodes is slow); the job does not start; exit status %d", preflight.ExitStatus)}
	}
	return &ExitError{Code: preflight.ExitStatus, Message: fmt.Sprintf("gotrain: the preflight gang check failed on %s, and the job does not start without it (--nnodes %s); every node exits %d", strings.Join(names, ", "), a.nnodes(), preflight.ExitStatus)}
}

// gangPlace is this node's place in generation g's gang check, its nodes
// in group rank order; false when this node has no place in it.
func (a *agent) gangPlace(g *gotrainv1.GenerationStarted) (preflight.GangNode, bool) {
	nodes := slices.Clone(g.GetNodes())
	slices.SortFunc(nodes, func(x, y *gotrainv1.GenerationNode) int { return int(x.GetGroupRank() - y.GetGroupRank()) })
	me := preflight.GangNode{Generation: g.GetGeneration(), Index: -1, Addr: a.cfg.NodeAddress, Token: a.cfg.JobToken, Elastic: a.jobElastic(), Serves: a.cfg.Coordinator == ""}
	for i, n := range nodes {
		if int(n.GetGroupRank()) != i {
			// A place in the check is a group rank (the coordinator
			// lets only its node put that place's keys).
			fmt.Fprintf(a.cfg.Stderr, "gotrain: warning: no preflight gang check: the generation's group ranks are not 0..%d\n", len(nodes)-1)
			return me, false
		}
		me.Nodes = append(me.Nodes, n.GetNodeId())
		if n.GetNodeId() == a.nodeID {
			me.Index = i
		}
	}
	return me, me.Index >= 0 // not this node's generation otherwise
}

// jobElastic: the job runs under --nnodes MIN:MAX, as this node knows it.
func (a *agent) jobElastic() bool {
	return a.cfg.MinNodes > 0 && a.cfg.MinNodes < a.cfg.Nodes
}

// gangHosts is the nodes' hostnames as the coordinator knows them ("" where
// it does not say): the lines name machines, which Slurm's --exclude takes.
func (a *agent) gangHosts(ctx context.Context, ids []string) []string {
	hosts := make([]string, len(ids))
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	st, err := a.coord.GetJobStatus(rctx, &gotrainv1.GetJobStatusRequest{})
	if err != nil {
		return hosts
	}
	for _, n := range st.GetNodes() {
		if i := slices.Index(ids, n.GetNodeId()); i >= 0 {
			hosts[i] = n.GetInfo().GetHostname()
		}
	}
	return hosts
}

// kvStore is the coordinator's KV store as the gang's rendezvous.
type kvStore struct{ c gotrainv1.CoordinatorClient }

var _ comm.Store = kvStore{}

func (s kvStore) Put(ctx context.Context, key string, value []byte) error {
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_, err := s.c.KVPut(rctx, &gotrainv1.KVPutRequest{Key: key, Value: value})
	return err
}

// Get waits for key until ctx ends, a few seconds a call.
func (s kvStore) Get(ctx context.Context, key string) ([]byte, error) {
	for {
		wait := 5 * time.Second
		if d, ok := ctx.Deadline(); ok {
			wait = min(wait, time.Until(d))
		}
		if wait <= 0 {
			return nil, context.DeadlineExceeded
		}
		rctx, cancel := context.WithTimeout(ctx, wait+2*time.Second)
		r, err := s.c.KVGet(rctx, &gotrainv1.KVGetRequest{Key: key, WaitMs: max(wait.Milliseconds(), 1)})
		cancel()
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if err == nil && r.GetFound() {
			return r.GetValue(), nil
		}
		if err != nil && !errors.Is(err, context.DeadlineExceeded) {
			// The coordinator is away a moment (a leader change): try
			// again, not faster than once a second.
			select {
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-time.After(time.Second):
			}
		}
	}
}
