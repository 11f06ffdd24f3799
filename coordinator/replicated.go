package coordinator

import (
	"bytes"
	"context"
	"encoding/gob"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/gotrain/gotrain/coordinator/job"
	"github.com/gotrain/gotrain/coordinator/replica"
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

func init() {
	for _, ev := range []job.Event{job.NodeJoined{}, job.NodeLost{}, job.WorkerExited{}, job.BarrierArrived{}, job.BarrierCanceled{},
		job.ProgressReported{}, job.Tick{}, job.NodeUnreachable{}, job.NodeReachable{}, job.WorkerParked{}, job.EvidenceReported{}} {
		gob.Register(ev)
	}
}

// entry is one entry of the replicated log. Exactly one of Event, Join, KV,
// Config, Replica is set.
type entry struct {
	Time        time.Time
	Event       job.Event
	Join        []byte // a JoinRequest without its CSR, host key and unknown fields
	Host        bool   // the join is of the node whose agent runs the coordinator
	JoinCSR     []byte // the CSR's SHA-256: a retried Join repeats it (joinKey)
	KV          *kvEntry
	Config      *configEntry
	Replica     string // a replica's gRPC address, added to the set
	ReplicaNode string // the node hosting it (embedded)
}

type kvEntry struct {
	Key   string
	Value []byte
}

// configEntry is the job's configuration, as the first leader has it.
type configEntry struct {
	Job job.Config
	// Peers: the replica set's gRPC addresses when it is fixed
	// (standalone); otherwise the first leader's, and Want is how many
	// replicas the joining nodes are asked to host (embedded).
	Peers []string
	Want  int
}

func (e entry) encode() ([]byte, error) {
	var b bytes.Buffer
	err := gob.NewEncoder(&b).Encode(&e)
	return b.Bytes(), err
}

func decodeEntry(b []byte) (entry, error) {
	var e entry
	err := gob.NewDecoder(bytes.NewReader(b)).Decode(&e)
	return e, err
}

// applied is what applying an entry gave: the call's answer or error.
type applied struct {
	v   any
	err error
}

// replState is a replica's part in replication. Guarded by Server.mu.
type replState struct {
	leading    bool
	term       uint64            // counts this replica's changes of leadership
	down       chan struct{}     // closed when the current leadership ends
	configured bool              // the config entry was applied
	peers      []string          // the replica set (gRPC addresses)
	want       int               // embedded: replicas to ask for
	asked      []string          // nodes asked to host one
	askedHosts []string          // their addresses
	hostOf     map[string]string // embedded: each replica's node (by gRPC address)
	history    []logged          // every entry applied, for snapshots
	ownConfig  job.Config        // this replica's own configuration
	fixed      []string          // standalone: the replica set --peers lists (ReplicaCA)
	hosted     bool              // started at the leader's request (ReplicaConfig.Hosted)
}

// logged is an applied entry kept for snapshots: its kind and node let
// Snapshot drop superseded progress reports and ticks.
type logged struct {
	Data     []byte
	Progress string // the node of a progress report; "" for other entries
	Tick     bool
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
func (s *Server) FSM() replica.FSM { return (*serverFSM)(s) }

// UseReplica makes the server replicated through n, with rc.
func (s *Server) UseReplica(n *replica.Node, rc ReplicaConfig) {
	s.mu.Lock()
	s.repl = n
	s.rs.ownConfig = s.m.Config()
	s.rs.fixed = rc.Peers
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
// otherwise: leaderUnary tells the caller where the leader is).
func (s *Server) commit(e entry) (any, error) {
	if s.repl == nil {
		s.mu.Lock()
		defer s.mu.Unlock()
		r := s.applyEntry(s.now(), e)
		return r.v, r.err
	}
	s.mu.Lock()
	over := s.m.Finished()
	var refused error
	if e.Event != nil && !over {
		// Only what the machine takes goes into the log.
		refused = s.m.Admit(e.Event)
	}
	s.mu.Unlock()
	if refused != nil {
		return nil, grpcError(refused)
	}
	if over && e.Event != nil {
		// The job's state is final on every replica: a late report (a
		// worker stopping after the end) changes nothing, and any replica
		// takes it, so that agents are not held by a replica set that
		// winds down.
		return nil, nil
	}
	e.Time = s.now()
	b, err := e.encode()
	if err != nil {
		return nil, status.Errorf(codes.Internal, "replicate: %v", err)
	}
	r, err := s.repl.Propose(b)
	if err != nil {
		var nl *replica.ErrNotLeader
		if errors.As(err, &nl) {
			return nil, nl
		}
		if errors.Is(err, replica.ErrEntryTooLarge) {
			return nil, status.Errorf(codes.InvalidArgument, "the request is too large for the coordinator's replicated log: %v", err)
		}
		return nil, status.Errorf(codes.Unavailable, "the coordinator's replicas could not agree: %v", err)
	}
	a, _ := r.(applied)
	return a.v, a.err
}

// applyEntry applies one entry at now. s.mu is held.
func (s *Server) applyEntry(now time.Time, e entry) applied {
	switch {
	case e.Event != nil:
		if err := s.applyEvent(now, e.Event); err != nil {
			return applied{err: grpcError(err)}
		}
		return applied{}
	case e.Join != nil:
		r, err := s.applyJoin(now, e.Join, e.Host, e.JoinCSR)
		return applied{v: r, err: err}
	case e.KV != nil:
		if err := s.store(e.KV.Key).Put(e.KV.Key, e.KV.Value); err != nil {
			return applied{err: kvError(err)} // limits.go
		}
		return applied{}
	case e.Config != nil:
		return applied{err: s.applyConfig(*e.Config)}
	case e.Replica != "":
		s.addPeer(e.Replica, e.ReplicaNode)
		return applied{}
	}
	return applied{err: status.Error(codes.Internal, "replicate: an empty log entry")}
}

// applyConfig sets the job's configuration from the log. s.mu is held.
func (s *Server) applyConfig(c configEntry) error {
	if s.rs.configured {
		return nil
	}
	m, err := job.New(c.Job)
	if err != nil {
		return status.Errorf(codes.InvalidArgument, "the job's configuration: %v", err)
	}
	s.m, s.rs.configured = m, true
	s.rs.peers, s.rs.want = slices.Clone(c.Peers), c.Want
	if c.Job != s.rs.ownConfig && !s.rs.hosted {
		s.log.Warn("this replica's job settings differ from the leader's; the leader's hold", "leader", fmt.Sprintf("%+v", c.Job))
	}
	return nil
}

// proposeLater queues ev, observed by this replica, for the log: only the
// leader proposes. s.mu is held.
func (s *Server) proposeLater(ev job.Event) {
	if !s.rs.leading || !s.rs.configured || s.stop.Err() != nil {
		return
	}
	s.proposals.push(entry{Time: s.now(), Event: ev})
}

// proposeQueued proposes the queued entries in order until ctx ends.
func (s *Server) proposeQueued(ctx context.Context) {
	for {
		e, ok := s.proposals.pop(ctx)
		if !ok {
			return
		}
		b, err := e.encode()
		if err == nil {
			var r any
			if r, err = s.repl.Propose(b); err == nil {
				err = r.(applied).err
			}
		}
		if err != nil {
			s.log.Debug("replicate an event", "event", fmt.Sprintf("%T", e.Event), "err", err)
		}
	}
}

// proposalQueue is an unbounded FIFO of entries: a holder of Server.mu
// pushes without waiting for Raft.
type proposalQueue struct {
	mu      sync.Mutex
	entries []entry
	wake    chan struct{}
}

func newProposalQueue() *proposalQueue { return &proposalQueue{wake: make(chan struct{}, 1)} }

func (q *proposalQueue) push(e entry) {
	q.mu.Lock()
	q.entries = append(q.entries, e)
	q.mu.Unlock()
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

func (q *proposalQueue) pop(ctx context.Context) (entry, bool) {
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
			return entry{}, false
		case <-q.wake:
		}
	}
}

// serverFSM is the Server as replica.FSM.
type serverFSM Server

func (f *serverFSM) Apply(b []byte) any {
	s := (*Server)(f)
	e, err := decodeEntry(b)
	if err != nil {
		s.log.Error("replicate: an entry this replica cannot read (replicas of different gotrain versions?)", "err", err)
		return applied{err: status.Errorf(codes.Internal, "replicate: %v", err)}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if e.Config == nil && !s.rs.configured {
		// Cannot happen: the first leader's first entry is the config.
		s.log.Error("replicate: an entry before the job's configuration")
	}
	r := s.applyEntry(e.Time, e)
	if r.err != nil {
		// A refused entry changed nothing: a restored replica does not
		// need it, and the snapshot does not keep it.
		return r
	}
	l := logged{Data: b}
	if p, ok := e.Event.(job.ProgressReported); ok {
		l.Progress = p.NodeID
	}
	_, l.Tick = e.Event.(job.Tick)
	s.rs.history = append(s.rs.history, l)
	return r
}

// Snapshot is every entry applied so far, but for progress reports and
// ticks superseded by later ones of the same node (a restored replica's
// hang detector starts from the latest progress; nothing else depends on
// them).
func (f *serverFSM) Snapshot() ([]byte, error) {
	s := (*Server)(f)
	s.mu.Lock()
	defer s.mu.Unlock()
	seen := map[string]bool{}
	tick := false
	keep := make([]logged, 0, len(s.rs.history))
	for i := len(s.rs.history) - 1; i >= 0; i-- {
		l := s.rs.history[i]
		switch {
		case l.Progress != "" && seen[l.Progress], l.Tick && tick:
			continue
		case l.Progress != "":
			seen[l.Progress] = true
		case l.Tick:
			tick = true
		}
		keep = append(keep, l)
	}
	slices.Reverse(keep)
	s.rs.history = keep
	var b bytes.Buffer
	err := gob.NewEncoder(&b).Encode(keep)
	return b.Bytes(), err
}

// Restore replaces the state with a snapshot's by applying its entries to
// a fresh state.
func (f *serverFSM) Restore(b []byte) error {
	s := (*Server)(f)
	var hist []logged
	if err := gob.NewDecoder(bytes.NewReader(b)).Decode(&hist); err != nil {
		return fmt.Errorf("restore the coordinator's state: %w", err)
	}
	s.mu.Lock()
	own := s.rs.ownConfig
	if own.RunID == "" {
		own = s.m.Config()
	}
	m, err := job.New(own)
	if err != nil {
		s.mu.Unlock()
		return err
	}
	s.m, s.nodeSeq, s.outboxes, s.joinKeys, s.aq.beating = m, 0, map[string]*outbox{}, nil, nil
	s.kv.Reset()
	s.comm.Reset()
	s.limits.joined = nil
	s.rs.configured, s.rs.peers, s.rs.asked, s.rs.askedHosts, s.rs.hostOf, s.rs.history = false, nil, nil, nil, nil, nil
	s.mu.Unlock()
	for _, l := range hist {
		f.Apply(l.Data)
	}
	return nil
}
