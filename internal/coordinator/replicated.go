package coordinator

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/gotrain/gotrain/internal/coordinator/logentry"
	"github.com/gotrain/gotrain/internal/coordinator/replica"
	"github.com/gotrain/gotrain/internal/coordinator/state"
	gotrainv1 "github.com/gotrain/gotrain/proto/gotrain/v1"
)

// A replicated coordinator (package replica: Raft) keeps the job's state
// on every replica by turning everything that changes it into a log entry:
// the machine's events, each with the time it happened (so every replica
// computes the same state), a node's join, a KV put, the job's
// configuration (the first entry: replicas started apart agree on it) and
// an added replica. The leader proposes; every replica applies, in the
// log's order, through the same code a single coordinator runs (commit,
// applyEntry), filling the nodes' outboxes alike. Only the leader acts:
// it answers calls, streams events, ticks, probes and gossips; the others
// refuse calls and name the leader (leaderconn.NotLeader), and the agents'
// client goes there. A watch stream carries on at the new leader from the
// last event the agent got (after_seq); barriers and long polls are
// called again there. The leader's part: leadership.go; the replica
// set: replicaset.go.

// replState is a replica's part in replication. Guarded by Server.mu.
type replState struct {
	leading bool
	term    uint64        // counts this replica's changes of leadership
	down    chan struct{} // closed when the current leadership ends
	hosted  bool          // started at the leader's request (ReplicaConfig.Hosted)
}

// stepDown returns a channel closed when leadership term ends (nil, never
// closed, when the coordinator is not replicated).
func (r *replState) stepDown(term uint64) <-chan struct{} {
	if r.down == nil {
		return nil
	}
	if term != r.term {
		return closedChan
	}
	return r.down
}

var closedChan = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// newTerm starts a new term of leadership (leading or not).
func (r *replState) newTerm(leading bool) {
	if r.down != nil {
		close(r.down)
	}
	r.down = make(chan struct{})
	r.term++
	r.leading = leading
}

// ReplicaConfig is how a Server is replicated.
type ReplicaConfig struct {
	// Peers is the fixed replica set (gRPC addresses), when it is fixed.
	Peers []string
	// Want is how many replicas the embedded coordinator asks joining
	// nodes to host (itself included); 0 or 1: none.
	Want int
	// Hosted: the replica was started on a joining node at the leader's
	// request; its own job settings are that node's flags, not the job's,
	// and differing from the leader's is no news.
	Hosted bool
}

// FSM returns the server as Raft's state machine (package replica); start
// the replica with it, then hand the replica to UseReplica before Serve.
// The state starts again without the lone coordinator's config entry: the
// log's first entry configures it.
func (s *Server) FSM() replica.FSM {
	s.mu.Lock()
	defer s.mu.Unlock()
	if st, err := state.New(s.cfg.Job); err == nil { // the config New took
		s.st = st
	}
	return (*serverFSM)(s)
}

// UseReplica makes the server replicated through n, with rc.
func (s *Server) UseReplica(n *replica.Node, rc ReplicaConfig) {
	s.mu.Lock()
	s.repl = n
	s.keys.self, s.keys.fixed = n.ID(), rc.Peers
	s.rs.hosted = rc.Hosted
	s.rs.down = make(chan struct{})
	s.proposals = newProposalQueue()
	s.mu.Unlock()
	n.OnLeadership(func(leading bool) { s.leadership(leading, rc) })
	if n.Leading() {
		s.leadership(true, rc)
	}
}

// commit applies e: at once on a single coordinator; through the log on a
// replicated one, which must be the leader (*replica.ErrNotLeader
// otherwise: leaderUnary tells the caller where the leader is). Either way
// the entry goes through state.State.Apply.
func (s *Server) commit(pe *gotrainv1.LogEntry) (state.Result, error) {
	e, err := logentry.FromProto(logentry.Stamp(pe, s.now()))
	if err != nil {
		return state.Result{}, status.Errorf(codes.Internal, "replicate: %v", err)
	}
	s.mu.Lock()
	if s.repl == nil {
		defer s.mu.Unlock()
		r := s.applyLocked(e)
		return r, stateError(r.Err)
	}
	over := s.st.Machine().Finished()
	var refused error
	if e.Event != nil && !over {
		// Only what the machine takes goes into the log.
		refused = s.st.Machine().Admit(e.Event)
	}
	s.mu.Unlock()
	if refused != nil {
		return state.Result{}, grpcError(refused)
	}
	if over && e.Event != nil {
		// The job's state is final on every replica: a late report (a
		// worker stopping after the end) changes nothing, and any replica
		// takes it, so that agents are not held by a replica set that
		// winds down.
		return state.Result{}, nil
	}
	b, err := logentry.Marshal(pe)
	if err != nil {
		return state.Result{}, status.Errorf(codes.Internal, "replicate: %v", err)
	}
	r, err := s.repl.Propose(b)
	if err != nil {
		var nl *replica.ErrNotLeader
		if errors.As(err, &nl) {
			return state.Result{}, nl
		}
		if errors.Is(err, replica.ErrEntryTooLarge) {
			return state.Result{}, status.Errorf(codes.InvalidArgument, "the request is too large for the coordinator's replicated log: %v", err)
		}
		return state.Result{}, status.Errorf(codes.Unavailable, "the coordinator's replicas could not agree: %v", err)
	}
	a, _ := r.(state.Result)
	return a, stateError(a.Err)
}

// applyLocked applies e to the state and carries out its effects. s.mu is
// held.
func (s *Server) applyLocked(e state.Entry) state.Result {
	r, effects := s.st.Apply(e)
	s.carry(effects)
	return r
}

// carry carries out the state's effects: at once what only wakes or
// answers a call, in the background (s.bg, which Serve joins) what waits.
// s.mu is held.
func (s *Server) carry(effects []state.Effect) {
	for _, ef := range effects {
		switch ef := ef.(type) {
		case state.Wake:
			if o := s.streams[ef.Node]; o != nil {
				o.notify()
			}
		case state.Drop:
			if o := s.streams[ef.Node]; o != nil {
				o.lost = ef.Reason
				o.notify()
				delete(s.streams, ef.Node)
			}
		case state.Answer:
			var err error
			if ef.Failed != "" {
				err = status.Error(codes.Aborted, ef.Failed)
			}
			s.waiters.answer(ef.Waiter, err)
		case state.ArmDeadline:
			s.tickOnDeadline(ef.At) // restart.go
		case state.RemoveVoters:
			if s.repl != nil && s.rs.leading {
				s.bg.do(s.reconcileVoters) // replicaset.go
			}
		case state.Finish:
			if h := s.hooks.finishing; h != nil {
				h()
			}
			s.logState("finished")
			select {
			case <-s.finished: // a replica restoring a snapshot finishes again
			default:
				close(s.finished)
			}
		case state.KeyPut:
			s.kvWaits.Put(ef.Key)
		case state.Heard:
			if o := s.streams[ef.Node]; o != nil && o.reports() { // reach.go
				s.log.Info("gossip found the node dead, but it reports: reachable", "node_id", ef.Node)
				s.reachability(ef.Node, o, "")
			}
		case state.Log:
			s.log.Log(context.Background(), slog.Level(4*(int(ef.Level)-1)), ef.Msg, ef.Args...)
		}
	}
}

// proposalQueue is an unbounded FIFO of entries: a holder of Server.mu
// pushes without waiting for Raft.
type proposalQueue struct {
	mu      sync.Mutex
	entries []*gotrainv1.LogEntry
	wake    chan struct{}
}

// proposeAll proposes the queued entries to n in order until ctx ends:
// the leader's events (its ticks, the streams that ended, gossip), each
// stamped with the time it was observed.
func (q *proposalQueue) proposeAll(ctx context.Context, n *replica.Node, log *slog.Logger) {
	for {
		e, ok := q.pop(ctx)
		if !ok {
			return
		}
		b, err := logentry.Marshal(e)
		if err == nil {
			var r any
			if r, err = n.Propose(b); err == nil {
				err = r.(state.Result).Err
			}
		}
		if err != nil {
			log.Debug("replicate an event", "entry", fmt.Sprintf("%T", e.GetEntry()), "err", err)
		}
	}
}

func newProposalQueue() *proposalQueue { return &proposalQueue{wake: make(chan struct{}, 1)} }

func (q *proposalQueue) push(e *gotrainv1.LogEntry) {
	q.mu.Lock()
	q.entries = append(q.entries, e)
	q.mu.Unlock()
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

func (q *proposalQueue) pop(ctx context.Context) (*gotrainv1.LogEntry, bool) {
	for {
		q.mu.Lock()
		if len(q.entries) > 0 {
			e := q.entries[0]
			q.entries = q.entries[1:]
			q.mu.Unlock()
			return e, true
		}
		q.mu.Unlock()
		select {
		case <-ctx.Done():
			return nil, false
		case <-q.wake:
		}
	}
}

// serverFSM is the Server as replica.FSM: the state's Apply, Encode and
// Decode (packages state, logentry), and the effects carried out.
type serverFSM Server

func (f *serverFSM) Apply(b []byte) any {
	s := (*Server)(f)
	e, err := logentry.Decode(b)
	if err != nil {
		s.log.Error("replicate: an entry this replica cannot read (replicas of different gotrain versions?)", "err", err)
		return state.Result{Err: &state.Refusal{Kind: state.Internal, Msg: "replicate: " + err.Error()}}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	first := e.Config != nil && !s.st.Configured()
	r := s.applyLocked(e)
	if n := s.st.Applied(); n >= 16 && n&(n-1) == 0 {
		s.logState("entry") // at 16, 32, 64, ... entries: replicas that stop apart still meet
	}
	if first && r.Err == nil && e.Config.Job != s.cfg.Job && !s.rs.hosted {
		s.log.Warn("this replica's job settings differ from the leader's; the leader's hold", "leader", fmt.Sprintf("%+v", e.Config.Job))
	}
	return r
}

func (f *serverFSM) Snapshot() ([]byte, error) {
	s := (*Server)(f)
	s.mu.Lock()
	defer s.mu.Unlock()
	return logentry.Snapshot(s.st)
}

func (f *serverFSM) Restore(b []byte) error {
	s := (*Server)(f)
	st, err := logentry.Restore(b, s.cfg.Job)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.st = st
	s.kvWaits.PutAll(func(key string) bool { _, ok := st.Store(key).Get(key); return ok })
	for id, o := range s.streams {
		if st.Outbox(id) == nil {
			o.lost = "this coordinator replica's state was replaced by a snapshot without the node"
			delete(s.streams, id)
		}
		o.notify()
	}
	if st.Result() != nil {
		s.carry([]state.Effect{state.Finish{Result: *st.Result()}})
	}
	return nil
}

// logState logs this replica's state hash and how many entries made it,
// at the job's end, as the replica stops and after a power-of-two count of
// entries: replicas that applied as many entries must log the same hash
// (the clustertests compare them). s.mu is held.
func (s *Server) logState(at string) {
	if s.repl == nil {
		return
	}
	hash := s.st.Digest() // state.State.Digest
	s.log.Info("coordinator replica state", "at", at, "replica", s.repl.ID(), "applied", s.st.Applied(), "state_hash", fmt.Sprintf("%x", hash[:]))
}
