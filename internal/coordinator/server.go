package coordinator

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/gotrain/gotrain/internal/coordinator/job"
	"github.com/gotrain/gotrain/internal/coordinator/kvwait"
	"github.com/gotrain/gotrain/internal/coordinator/logentry"
	"github.com/gotrain/gotrain/internal/coordinator/replica"
	"github.com/gotrain/gotrain/internal/coordinator/state"
	"github.com/gotrain/gotrain/internal/jobtls"
	gotrainv1 "github.com/gotrain/gotrain/proto/gotrain/v1"
)

// ErrInvalidConfig is returned by New for an unusable Config.
var ErrInvalidConfig = errors.New("coordinator: invalid config")

const (
	// tickInterval is how often the machine gets a Tick.
	tickInterval = time.Second
	// stopGrace is how long Serve waits for calls in flight before it cuts
	// them off.
	stopGrace = 2 * time.Second
	// keepaliveTime and keepaliveTimeout: the server pings a connection
	// silent for keepaliveTime and drops it when no answer comes within
	// keepaliveTimeout. Agents ping as often (KeepaliveTime).
	keepaliveTime    = 10 * time.Second
	keepaliveTimeout = 10 * time.Second
	// maxKVWait bounds KVGet's wait_ms (the call's deadline still applies).
	maxKVWait = 24 * time.Hour
)

// Config configures a Server.
type Config struct {
	// Job is the job's settings, declared once (internal/coordinator/job): a run id
	// is required; Nodes defaults to 1. RendezvousTimeout counts from when
	// Serve starts. New fills the defaults in.
	Job job.Config
	// Token is the job token every call must carry; required.
	Token string
	// Logger receives the job's events; default: discard.
	Logger *slog.Logger
	// TLS, when not nil, is the server's TLS configuration
	// (jobtls.ServerConfig); nil serves plaintext (tests).
	TLS *tls.Config
	// CA, when not nil, is the job CA: Join issues each node a certificate
	// from it, and later calls act only for the node their certificate
	// names (identity.go). It needs TLS.
	CA *jobtls.CA
	// HostKey, when not empty, is the secret of the agent that runs this
	// coordinator: a Join that gives it is that agent's node, the first
	// in the node order (admit.go).
	HostKey []byte
}

// Server is a job's coordinator.
type Server struct {
	gotrainv1.UnimplementedCoordinatorServer

	cfg  Config
	log  *slog.Logger
	now  func() time.Time
	stop context.Context // canceled when Serve shuts down
	halt context.CancelFunc

	finished chan struct{} // closed on FinishJob

	// recoveries: the agents' timed restarts, phase by phase (metrics.go).
	recoveries *prometheus.HistogramVec

	mu sync.Mutex
	// st is the state every replica holds alike (package state): the
	// machine, the nodes' outboxes, the stores, the replica set.
	st      *state.State
	serving bool
	streams streamTable   // per node present: its watch stream's transport
	waiters waiters       // the Barrier calls waiting here (waiters.go)
	kvWaits *kvwait.Waits // the KVGet calls waiting here for a key
	// deadline is the machine deadline a timer is armed for (restart.go).
	deadline      time.Time
	deadlineArmed bool
	// gossipPort is the coordinator's memberlist port (gossip.go); 0: none.
	gossipPort int
	gossip     *gossipEvents // nil without gossip
	// bg runs the timers and goroutines no call waits for (probes, timers
	// for deadlines, voter changes); Serve ends them (background.go).
	bg background
	// limits are the bounds on callers, bounds on the text of requests
	// (limits.go).
	limits limits
	bounds *requestBounds
	// keys: who may have the replica set's keys (replicakeys.go).
	keys replicaKeys
	// snapKey is the job's snapshot key (New), nil without a CA.
	snapKey []byte

	// Replication (replicated.go): repl is nil when the coordinator is not
	// replicated; the rest is the replicated state outside the machine and
	// this replica's part in it.
	repl      *replica.Node
	rs        replState
	proposals *proposalQueue
	// aq: the agents this replica hears while it leads (agentquorum.go).
	aq agentQuorum

	hooks testHooks
}

// testHooks let tests learn that a call is waiting, without sleeping.
type testHooks struct {
	kvWaiting       func(key string)
	barrierWaiting  func(name string, rank int32)
	barrierCanceled func(name string, rank int32) // the arrival is withdrawn
	finishing       func()                        // under s.mu, as the job finishes
}

var _ gotrainv1.CoordinatorServer = (*Server)(nil)

// outbox is the transport of one node's watch stream; its events are the
// state's (state.Outbox), numbered from 1, which every replica fills alike,
// so that a node whose stream opens late, or again after a blip or at a
// new leader, sees every event after the last one it got
// (WatchGenerationsRequest.after_seq), in order. Guarded by Server.mu.
type outbox struct {
	attached bool   // a watch stream serves this outbox
	stream   uint64 // the number of the latest watch stream; an older one ends
	// agentStream is the agent's own number of the stream served
	// (WatchGenerationsRequest.stream): one numbered lower is stale.
	agentStream uint64
	lost        string // the node was lost: end the stream with this
	// gossipDown: gossip finds the node dead; unreachable: the machine was
	// told so (reach.go).
	gossipDown, unreachable bool
	blamed                  bool // logged as unreachable, its peers agreeing (reach.go)
	// wake is closed (and replaced) by notify: a broadcast, since two
	// streams of one node may wait at once (the served one and its
	// successor) and a one-token channel let the newer stream take the
	// wake-up meant for the older, which then never learnt it was
	// superseded.
	wake chan struct{}
}

func newOutbox() *outbox { return &outbox{wake: make(chan struct{})} }

// notify wakes every stream waiting on o; called with Server.mu held.
func (o *outbox) notify() {
	close(o.wake)
	o.wake = make(chan struct{})
}

// New returns a coordinator for one job.
func New(cfg Config) (*Server, error) {
	if cfg.Token == "" {
		return nil, fmt.Errorf("%w: token is empty: generate one with token.Generate and give it to every agent", ErrInvalidConfig)
	}
	if cfg.CA != nil && cfg.TLS == nil {
		return nil, fmt.Errorf("%w: a CA without TLS: node certificates need TLS to be presented", ErrInvalidConfig)
	}
	st, err := state.New(cfg.Job)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	jc := st.Machine().Config()
	// A lone coordinator's log is its own: its configuration first.
	st.Apply(state.Entry{Config: &state.Config{Job: jc, NprocPerNode: MaxNprocPerNode, RanksPerJob: MaxRanksPerJob}})
	cfg.Job = jc // with its defaults
	logger := cfg.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	var snapKey []byte
	if cfg.CA != nil {
		// The snapshot tier's MAC key (internal/memsnap/mac.go): derived
		// from the CA's key, so every replica hands out the same one and no
		// token holder can compute it; sent only with a generation's start,
		// to its nodes (convert.go).
		if snapKey, err = cfg.CA.DeriveKey("memsnap"); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
		}
	}
	stop, halt := context.WithCancel(context.Background())
	return &Server{
		snapKey:  snapKey,
		cfg:      cfg,
		log:      logger.With("run_id", cfg.Job.RunID),
		now:      time.Now,
		stop:     stop,
		halt:     halt,
		finished: make(chan struct{}),
		st:       st,
		streams:  streamTable{},
		waiters:  newWaiters(),
		kvWaits:  kvwait.New(),
		bounds:   &requestBounds{log: logger.With("run_id", cfg.Job.RunID)},
		keys:     replicaKeys{ca: cfg.CA},

		recoveries: newRecoveryHistograms(),
	}, nil
}

// Finished is closed once the job finished, successfully or not.
func (s *Server) Finished() <-chan struct{} { return s.finished }

// Result returns how the job finished, or nil before Finished is closed.
func (s *Server) Result() *gotrainv1.JobFinished {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.st.Result() == nil {
		return nil
	}
	return finishedToProto(*s.st.Result())
}

// Serve answers calls on lis until ctx is done, then stops: calls still
// waiting (watch streams, barriers, long polls) end with Unavailable, and
// calls in flight get a short grace period. It returns nil when ctx ended it.
// Serve may be called once.
func (s *Server) Serve(ctx context.Context, lis net.Listener) error {
	s.mu.Lock()
	if s.serving {
		s.mu.Unlock()
		return errors.New("coordinator: Serve called twice; a Server serves once")
	}
	s.serving = true
	s.mu.Unlock()

	gs := grpc.NewServer(s.serverOptions(lis)...) // limits.go
	gotrainv1.RegisterCoordinatorServer(gs, s)
	s.mu.Lock()
	if err := s.step(job.Tick{}); err != nil { // the rendezvous clock starts now
		s.log.Error("tick", "err", err)
	}
	s.mu.Unlock()
	s.bg.start() // what applying entries asked for before Serve (background.go)
	serveErr := make(chan error, 1)
	go func() { serveErr <- gs.Serve(lis) }()
	tickDone := make(chan struct{})
	go func() {
		defer close(tickDone)
		var wg sync.WaitGroup
		if s.repl != nil {
			wg.Go(func() { s.proposals.proposeAll(s.stop, s.repl, s.log) }) // replicated.go
		}
		s.tick(s.stop)
		wg.Wait()
	}()
	s.log.Info("coordinator serving", "addr", lis.Addr().String(), "nodes", s.cfg.Job.Nodes, "max_restarts", s.cfg.Job.MaxRestarts)

	var err error
	served := false
	select {
	case <-ctx.Done():
	case err = <-serveErr:
		served = true
		err = fmt.Errorf("coordinator: serve on %s: %w", lis.Addr(), err)
	}
	s.halt()
	stopped := make(chan struct{})
	go func() {
		gs.GracefulStop()
		close(stopped)
	}()
	select {
	case <-stopped:
	case <-time.After(stopGrace):
		gs.Stop()
		<-stopped
	}
	if !served {
		<-serveErr // gs.Serve returns once stopped; its goroutine ends before Serve does
	}
	<-tickDone
	s.bg.close()
	s.mu.Lock()
	s.logState("stop") // replicated.go
	s.mu.Unlock()
	return err
}

func (s *Server) tick(ctx context.Context) {
	t := time.NewTicker(tickInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			s.mu.Lock()
			if err := s.step(job.Tick{}); err != nil {
				s.log.Error("tick", "err", err)
			}
			s.checkAgentQuorum() // agentquorum.go
			s.mu.Unlock()
		}
	}
}

// step feeds ev, an event the server itself observed (a tick, a stream's
// end, gossip), to the state (through the log when replicated: the
// leader proposes, the replicas apply it in the log's order; elsewhere it
// is dropped: only the leader acts). s.mu is held.
func (s *Server) step(ev job.Event) error {
	pe := eventEntry(ev) // convert.go
	if s.repl != nil {
		if s.rs.leading && s.st.Configured() && s.stop.Err() == nil {
			s.proposals.push(logentry.Stamp(pe, s.now())) // replicated.go
		}
		return nil
	}
	e, err := logentry.FromProto(logentry.Stamp(pe, s.now()))
	if err == nil {
		err = stateError(s.applyLocked(e).Err)
	}
	return err
}

// Join registers a node and gives it its id.
func (s *Server) Join(_ context.Context, req *gotrainv1.JoinRequest) (*gotrainv1.JoinResponse, error) {
	if req.GetNode() == nil {
		return nil, status.Error(codes.InvalidArgument, "join without node facts: set JoinRequest.node")
	}
	if s.cfg.CA != nil {
		if err := checkCSR(req); err != nil { // identity.go
			return nil, err
		}
	}
	host, err := hostJoin(s.cfg.HostKey, req) // admit.go
	if err != nil {
		return nil, err
	}
	logged, err := loggedJoin(req)
	if err != nil {
		return nil, err
	}
	csr := sha256.Sum256(req.GetCsr())
	s.mu.Lock()
	err = s.st.Admit(logentry.JoinFromProto(logged, host, csr[:])) // a retry is answered as the node it joined as
	s.mu.Unlock()
	if err != nil {
		s.log.Warn("join rejected", "hostname", truncate(req.GetNode().GetHostname(), 64), "err", err)
		return nil, stateError(err) // a refused join leaves nothing in the log
	}
	r, err := s.commit(&gotrainv1.LogEntry{Entry: &gotrainv1.LogEntry_Join{Join: &gotrainv1.LogJoin{Request: logged, Host: host, CsrSha256: csr[:]}}})
	if err != nil {
		return nil, err
	}
	joined := r.Join
	var cert []byte
	if s.cfg.CA != nil {
		if cert, err = s.cfg.CA.IssueNode(joined.ID, req.GetCsr()); err != nil {
			return nil, status.Errorf(codes.InvalidArgument, "join: %v", err)
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	jc := s.st.Machine().Config()
	var caCert []byte
	if s.cfg.CA != nil {
		caCert = s.cfg.CA.Cert.Raw // the key that signs leader hints (replicakeys.go)
	}
	return &gotrainv1.JoinResponse{NodeId: joined.ID, RunId: jc.RunID, MaxRestarts: int32(jc.MaxRestarts), GossipPort: int32(s.gossipPort), Warnings: joined.Warnings,
		NodeTimeoutMs: jc.NodeTimeout.Milliseconds(), NodeCert: cert, Replicas: replicaAddrs(s.repl, s.st.Peers()), HostReplica: joined.HostReplica, CaCert: caCert}, nil
}

// WatchGenerations streams the node's generation events. The stream is the
// node's contact: when it ends before the job finished, the node is
// unreachable until its agent opens a new one, and lost only after its node
// timeout (reach.go); a newer stream of the node supersedes this one.
func (s *Server) WatchGenerations(req *gotrainv1.WatchGenerationsRequest, stream grpc.ServerStreamingServer[gotrainv1.GenerationEvent]) error {
	id := req.GetNodeId()
	s.mu.Lock()
	o := s.streams.of(s.st, id)
	switch {
	case o == nil && s.st.Result() != nil:
		// The job is over (and the node may be gone): say so and end.
		res := finishedToProto(*s.st.Result())
		s.mu.Unlock()
		return stream.Send(&gotrainv1.GenerationEvent{Event: &gotrainv1.GenerationEvent_Finished{Finished: res}})
	case o == nil:
		s.mu.Unlock()
		return status.Errorf(codes.NotFound, "unknown node id %q: call Join first, and watch with the node id it returned", id)
	}
	// A new stream replaces an older one, which may not know yet that its
	// connection is gone (a blip): the agent reconnects within its node
	// timeout. Streams of one agent may arrive out of order (one queued in
	// a partition, delivered after the one the agent opened since, on
	// another connection): by the agent's numbers, the newest wins.
	if n := req.GetStream(); n != 0 && n < o.agentStream {
		served := o.agentStream
		s.mu.Unlock()
		return superseded(id, n, served)
	}
	o.agentStream = max(o.agentStream, req.GetStream())
	o.stream++
	my := o.stream
	o.attached = true
	o.notify()
	s.reachability(id, o, "")
	box := s.st.Outbox(id)
	pos := min(int(req.GetAfterSeq()), len(box.Events))
	if pos > 0 {
		// A stream resumed: after a blip, or at a new leader.
		s.log.Info("watch stream resumed", "node_id", id, "after_seq", pos)
	}
	if box.Closed && pos == len(box.Events) {
		// A new stream after the job finished and the node heard so: say
		// so again.
		res := finishedToProto(*s.st.Result())
		s.mu.Unlock()
		s.streamEnded(id, o, my, "")
		return stream.Send(&gotrainv1.GenerationEvent{Event: &gotrainv1.GenerationEvent_Finished{Finished: res}, Seq: uint64(pos)})
	}
	term := s.rs.term
	s.mu.Unlock()

	ctx := stream.Context()
	stopping := false
	for {
		// Queued events go out first, also when the coordinator stops: the
		// job's last words (finished) must reach the agents.
		s.mu.Lock()
		if o.stream != my {
			served := o.agentStream
			s.mu.Unlock()
			return superseded(id, req.GetStream(), served)
		}
		if s.rs.term != term && !s.st.Machine().Finished() {
			// This replica stopped leading: the agent goes on at the new
			// leader, from where it is.
			s.mu.Unlock()
			s.streamEnded(id, o, my, "")
			return s.notLeader(stream.Context())
		}
		term = s.rs.term            // after the end, any replica finishes the stream
		down := s.rs.stepDown(term) // read under s.mu: newTerm replaces it
		wake := o.wake
		var evs []state.Out
		closed, lost := false, o.lost
		if box := s.st.Outbox(id); box != nil {
			evs, closed = box.Events[pos:], box.Closed
			pos = len(box.Events)
		} else if lost == "" {
			lost = "the coordinator no longer has it"
		}
		s.mu.Unlock()
		if lost != "" {
			s.streamEnded(id, o, my, "")
			return status.Errorf(codes.Aborted, "this node was lost (%s); its workers must stop", lost)
		}
		for _, ev := range evs {
			if err := stream.Send(outToProto(id, ev, s.snapKey)); err != nil { // convert.go
				// The agent's next stream starts after the last event it got.
				s.streamEnded(id, o, my, fmt.Sprintf("watch stream broke: %v", err))
				return err
			}
		}
		switch {
		case closed:
			s.streamEnded(id, o, my, "")
			return nil
		case stopping:
			s.streamEnded(id, o, my, "")
			return status.Error(codes.Unavailable, "coordinator is shutting down")
		}
		select {
		case <-wake:
		case <-ctx.Done():
			s.streamEnded(id, o, my, fmt.Sprintf("its agent disconnected (it exited or was killed, or the network to it failed): %v", context.Cause(ctx)))
			return status.FromContextError(ctx.Err()).Err()
		case <-s.stop.Done():
			stopping = true
		case <-down:
		}
	}
}

// superseded ends watch stream n of node id, which its stream served
// replaces: ALREADY_EXISTS, which the agent takes as a blip (its newer
// stream goes on), never Aborted, which ends its contact for good.
func superseded(id string, n, served uint64) error {
	return status.Errorf(codes.AlreadyExists, "superseded: node %q opened a newer watch stream (its stream %d is served; this is %d)", id, served, n)
}

// streamEnded detaches o from node id's stream number my (unless a newer
// stream replaced it); unless the job finished or the coordinator is
// stopping, the node is unreachable for reason until it opens a new stream
// (reach.go), and its agent is probed.
func (s *Server) streamEnded(id string, o *outbox, my uint64, reason string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if o.stream != my {
		return
	}
	o.attached = false
	if s.st.Machine().Finished() || s.stop.Err() != nil || s.streams[id] != o || reason == "" {
		return
	}
	s.reachability(id, o, reason)
	s.bg.do(func() { s.probe(id, reason) })
}

// KVPut stores a value once.
func (s *Server) KVPut(_ context.Context, req *gotrainv1.KVPutRequest) (*gotrainv1.KVPutResponse, error) {
	if req.GetKey() == "" {
		return nil, status.Error(codes.InvalidArgument, "kv put: key is empty")
	}
	// Neither a refused put nor a repeated one reaches the log.
	s.mu.Lock()
	// state.State.Store: a communicator's rendezvous key has a store of its own
	held, err := s.st.Store(req.GetKey()).Check(req.GetKey(), req.GetValue())
	s.mu.Unlock()
	if err != nil {
		return nil, kvError(err) // limits.go
	} else if held {
		return &gotrainv1.KVPutResponse{}, nil
	}
	if _, err := s.commit(&gotrainv1.LogEntry{Entry: &gotrainv1.LogEntry_KvPut{KvPut: &gotrainv1.KVPutRequest{Key: req.GetKey(), Value: req.GetValue()}}}); err != nil {
		return nil, err
	}
	return &gotrainv1.KVPutResponse{}, nil
}

// KVGet returns a key's value, waiting up to wait_ms (or the call's deadline)
// for it to appear.
func (s *Server) KVGet(ctx context.Context, req *gotrainv1.KVGetRequest) (*gotrainv1.KVGetResponse, error) {
	key := req.GetKey()
	if key == "" {
		return nil, status.Error(codes.InvalidArgument, "kv get: key is empty")
	}
	// The store is the state's (a snapshot may replace it): read it under
	// s.mu each time. A reader that waits is watched before s.mu is let
	// go, and a put wakes it under s.mu (carry: state.KeyPut), so no put
	// falls in between.
	found := func() (*gotrainv1.KVGetResponse, error) {
		st := s.st.Store(key)
		if err := st.CheckKey(key); err != nil {
			return nil, kvError(err)
		}
		v, ok := st.Get(key)
		return &gotrainv1.KVGetResponse{Found: ok, Value: v}, nil
	}
	foundLocked := func() (*gotrainv1.KVGetResponse, error) {
		s.mu.Lock()
		defer s.mu.Unlock()
		return found()
	}
	s.mu.Lock()
	r, err := found()
	if err != nil || r.GetFound() || req.GetWaitMs() <= 0 {
		s.mu.Unlock()
		return r, err
	}
	ready, release := s.kvWaits.Watch(key)
	stepDown := s.rs.stepDown(s.rs.term)
	s.mu.Unlock()
	defer release()
	wait := maxKVWait
	if ms := req.GetWaitMs(); ms < maxKVWait.Milliseconds() {
		wait = time.Duration(ms) * time.Millisecond
	}
	timer := time.NewTimer(wait)
	defer timer.Stop()
	if h := s.hooks.kvWaiting; h != nil {
		h(key)
	}
	select {
	case <-ready:
		return foundLocked()
	case <-timer.C:
		return foundLocked()
	case <-ctx.Done():
		return nil, status.FromContextError(ctx.Err()).Err()
	case <-s.stop.Done():
		return nil, status.Error(codes.Unavailable, "coordinator is shutting down")
	case <-stepDown:
		return nil, s.notLeader(ctx)
	}
}

// Barrier returns once every rank of the generation called it, or fails with
// Aborted when the generation ends first.
func (s *Server) Barrier(ctx context.Context, req *gotrainv1.BarrierRequest) (*gotrainv1.BarrierResponse, error) {
	s.mu.Lock()
	w, ch := s.waiters.add()
	stepDown := s.rs.stepDown(s.rs.term)
	s.mu.Unlock()
	drop := func() {
		s.mu.Lock()
		s.waiters.drop(w)
		s.mu.Unlock()
	}
	// The arrival is withdrawn from the replicated barrier; the commit
	// never fails but for a lost leadership.
	cancel := func() {
		drop()
		_, _ = s.commit(&gotrainv1.LogEntry{Entry: &gotrainv1.LogEntry_BarrierCanceled{BarrierCanceled: &gotrainv1.LogBarrierCanceled{Waiter: w}}})
	}
	if _, err := s.commit(&gotrainv1.LogEntry{Entry: &gotrainv1.LogEntry_Barrier{Barrier: &gotrainv1.LogBarrier{Name: req.GetName(), Generation: req.GetGeneration(), Rank: req.GetRank(), Waiter: w}}}); err != nil {
		drop()
		return nil, err
	}
	if h := s.hooks.barrierWaiting; h != nil {
		h(req.GetName(), req.GetRank())
	}
	select {
	case err := <-ch:
		if err != nil {
			return nil, err
		}
		return &gotrainv1.BarrierResponse{}, nil
	case <-ctx.Done():
		cancel()
		if h := s.hooks.barrierCanceled; h != nil {
			h(req.GetName(), req.GetRank())
		}
		return nil, status.FromContextError(ctx.Err()).Err()
	case <-s.stop.Done():
		cancel()
		return nil, status.Error(codes.Unavailable, "coordinator is shutting down")
	case <-stepDown:
		// The caller arrives again at the new leader; this arrival stays
		// in the replicated barrier, and its answer goes nowhere.
		drop()
		return nil, s.notLeader(ctx)
	}
}

// ReportProgress stores the progress of a node's ranks.
func (s *Server) ReportProgress(_ context.Context, req *gotrainv1.ReportProgressRequest) (*gotrainv1.ReportProgressResponse, error) {
	// Observed by the coordinator that is asked (the leader), not through
	// the log: the histograms are this process's, as a scrape of it says.
	s.observeRecoveries(req.GetRecoveries())
	s.mu.Lock()
	if s.repl != nil && s.rs.leading {
		s.aq.heartbeat(req.GetNodeId(), s.now()) // agentquorum.go
	}
	s.mu.Unlock()
	if _, err := s.commit(&gotrainv1.LogEntry{Entry: &gotrainv1.LogEntry_Progress{Progress: req}}); err != nil {
		return nil, err
	}
	return &gotrainv1.ReportProgressResponse{}, nil
}

// ReportWorkerExit records that a worker process ended, or that a
// recoverable one is parked.
func (s *Server) ReportWorkerExit(_ context.Context, req *gotrainv1.ReportWorkerExitRequest) (*gotrainv1.ReportWorkerExitResponse, error) {
	if req.GetParked() {
		// A recoverable worker waits in process for the next generation.
		s.log.Debug("worker parked", "node_id", req.GetNodeId(), "generation", req.GetGeneration(), "rank", req.GetRank(), "pid", req.GetPid())
	} else {
		s.log.Debug("worker exited", "node_id", req.GetNodeId(), "generation", req.GetGeneration(), "rank", req.GetRank(),
			"pid", req.GetPid(), "exit_code", req.GetExitCode(), "signal", req.GetSignal())
	}
	if _, err := s.commit(&gotrainv1.LogEntry{Entry: &gotrainv1.LogEntry_WorkerExit{WorkerExit: req}}); err != nil {
		return nil, err
	}
	return &gotrainv1.ReportWorkerExitResponse{}, nil
}

// GetJobStatus returns a snapshot of the job.
func (s *Server) GetJobStatus(context.Context, *gotrainv1.GetJobStatusRequest) (*gotrainv1.JobStatus, error) {
	s.mu.Lock()
	st := s.st.Machine().Status()
	s.mu.Unlock()
	return statusToProto(st), nil
}

// HasNode says whether node id is in the job (tests, tools).
func (s *Server) HasNode(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.st.Machine().HasNode(id)
}
