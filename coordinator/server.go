package coordinator

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math/rand/v2"
	"net"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/gotrain/gotrain/coordinator/job"
	"github.com/gotrain/gotrain/coordinator/kv"
	"github.com/gotrain/gotrain/coordinator/replica"
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
	// RunID names the job run; required.
	RunID string
	// Token is the job token every call must carry; required.
	Token string
	// Nodes is how many nodes the job runs on at most; default 1. MinNodes,
	// NodeTimeout and JoinSettle: see coordinator/job's membership.go.
	Nodes       int
	MinNodes    int
	NodeTimeout time.Duration
	JoinSettle  time.Duration
	// MaxRestarts is how many times a failed generation restarts; default 0.
	MaxRestarts int
	// RestartCountBase starts the restart count workers see (job.Config).
	RestartCountBase int
	// RestartBackoff is the pause before a failed generation restarts.
	RestartBackoff time.Duration
	// HangTimeout, OnHang: the hang detector (see coordinator/job).
	HangTimeout time.Duration
	OnHang      string
	// RendezvousTimeout bounds the wait for all nodes to join, from when
	// Serve starts; the job fails after it. 0 waits forever.
	RendezvousTimeout time.Duration
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
	kv   *kv.Store
	comm *kv.Store // communicators' rendezvous keys (Server.store, limits.go)
	now  func() time.Time
	stop context.Context // canceled when Serve shuts down
	halt context.CancelFunc

	finished chan struct{} // closed on FinishJob

	mu        sync.Mutex
	m         *job.Machine
	serving   bool
	nodeSeq   int
	joinKeys  map[string]string  // joinKey -> node id: a Join retried is the same node
	outboxes  map[string]*outbox // per node present: events for its watch stream
	waiters   map[uint64]chan error
	waiterSeq uint64
	result    *gotrainv1.JobFinished
	// deadline is the machine deadline a timer is armed for (restart.go).
	deadline      time.Time
	deadlineArmed bool
	// plan is the ended generation a restart may follow, until the
	// restart is announced to the nodes (restart.go).
	plan restartPlan
	// gossipPort is the coordinator's memberlist port (gossip.go); 0: none.
	gossipPort int
	gossip     *gossipEvents // nil without gossip
	// bg runs the timers and goroutines no call waits for (probes, timers
	// for deadlines, voter changes); Serve ends them (background.go).
	bg background
	// limits are the bounds on callers (limits.go).
	limits limits

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

// outbox holds the generation events of one node, numbered from 1 (seq). It
// lives from the node's Join until the node is lost, so a node whose stream
// opens late, or again after a blip or at a new leader, sees every event
// after the last one it got (WatchGenerationsRequest.after_seq), in order.
// Every replica fills it alike. Guarded by Server.mu.
type outbox struct {
	events   []*gotrainv1.GenerationEvent
	closed   bool   // the job finished; end the stream once events are sent
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
	wake                    chan struct{}
}

func newOutbox() *outbox { return &outbox{wake: make(chan struct{}, 1)} }

// push appends a copy of ev (one event may go to several nodes, each with
// its own seq).
func (o *outbox) push(ev *gotrainv1.GenerationEvent) {
	ev = proto.CloneOf(ev)
	ev.Seq = uint64(len(o.events) + 1)
	o.events = append(o.events, ev)
	o.notify()
}

func (o *outbox) notify() {
	select {
	case o.wake <- struct{}{}:
	default:
	}
}

// New returns a coordinator for one job.
func New(cfg Config) (*Server, error) {
	if cfg.Token == "" {
		return nil, fmt.Errorf("%w: token is empty: generate one with token.Generate and give it to every agent", ErrInvalidConfig)
	}
	if cfg.CA != nil && cfg.TLS == nil {
		return nil, fmt.Errorf("%w: a CA without TLS: node certificates need TLS to be presented", ErrInvalidConfig)
	}
	m, err := job.New(job.Config{RunID: cfg.RunID, Nodes: cfg.Nodes, MinNodes: cfg.MinNodes, NodeTimeout: cfg.NodeTimeout, JoinSettle: cfg.JoinSettle,
		MaxRestarts: cfg.MaxRestarts, RestartBackoff: cfg.RestartBackoff, RestartCountBase: cfg.RestartCountBase,
		HangTimeout: cfg.HangTimeout, OnHang: cfg.OnHang, RendezvousTimeout: cfg.RendezvousTimeout})
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	jc := m.Config()
	cfg.Nodes, cfg.MaxRestarts = jc.Nodes, jc.MaxRestarts
	cfg.MinNodes, cfg.NodeTimeout, cfg.JoinSettle = jc.MinNodes, jc.NodeTimeout, jc.JoinSettle
	logger := cfg.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	stop, halt := context.WithCancel(context.Background())
	return &Server{
		cfg:      cfg,
		log:      logger.With("run_id", cfg.RunID),
		kv:       kv.New(),
		comm:     kv.New(),
		now:      time.Now,
		stop:     stop,
		halt:     halt,
		finished: make(chan struct{}),
		m:        m,
		outboxes: map[string]*outbox{},
		waiters:  map[uint64]chan error{},
		// Waiter ids are unique across replicas: a leader's are in the
		// replicated barrier state, and the next leader's must not clash.
		waiterSeq: rand.Uint64() &^ (1<<32 - 1),
	}, nil
}

// Finished is closed once the job finished, successfully or not.
func (s *Server) Finished() <-chan struct{} { return s.finished }

// Result returns how the job finished, or nil before Finished is closed.
func (s *Server) Result() *gotrainv1.JobFinished {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.result == nil {
		return nil
	}
	return proto.CloneOf(s.result)
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
	serveErr := make(chan error, 1)
	go func() { serveErr <- gs.Serve(lis) }()
	tickDone := make(chan struct{})
	go func() {
		defer close(tickDone)
		var wg sync.WaitGroup
		if s.repl != nil {
			wg.Go(func() { s.proposeQueued(s.stop) }) // replicated.go
		}
		s.tick(s.stop)
		wg.Wait()
	}()
	s.log.Info("coordinator serving", "addr", lis.Addr().String(), "nodes", s.cfg.Nodes, "max_restarts", s.cfg.MaxRestarts)

	var err error
	select {
	case <-ctx.Done():
	case err = <-serveErr:
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
	<-tickDone
	s.bg.close()
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
// end, gossip), to the machine and carries out the actions. s.mu is held.
// A replicated coordinator's leader proposes it instead (replicated.go),
// and the replicas apply it in the log's order; elsewhere it is dropped:
// only the leader acts.
func (s *Server) step(ev job.Event) error {
	if s.repl != nil {
		s.proposeLater(ev)
		return nil
	}
	return s.applyEvent(s.now(), ev)
}

// applyEvent feeds ev, at now, to the machine and carries out the actions.
// Every replica runs it for every event, in the same order. s.mu is held.
func (s *Server) applyEvent(now time.Time, ev job.Event) error {
	if lost, ok := ev.(job.NodeLost); ok {
		s.dropNode(lost) // gossip.go
	}
	acts, err := s.m.Step(now, ev)
	if err != nil {
		return err
	}
	s.apply(acts)
	s.announceWait(now) // restart.go
	s.dropLost()        // reach.go
	s.tickOnDeadline()
	s.replaceLostReplicas() // replicated.go
	if p, ok := ev.(job.ProgressReported); ok {
		s.heardFrom(p.NodeID) // reach.go: a report (a heartbeat when empty) overrules gossip
		s.aq.beat(p.NodeID)   // agentquorum.go
	}
	return nil
}

// apply carries out the machine's actions. s.mu is held; nothing here blocks.
func (s *Server) apply(acts []job.Action) {
	for _, a := range acts {
		switch a := a.(type) {
		case job.StartGeneration:
			s.announceRestart(a.RestartCount, 0) // restart.go: one that starts at once
			s.plan.restarts = a.RestartCount
			s.log.Info("generation started", "generation", a.Generation, "world_size", a.WorldSize,
				"restart_count", a.RestartCount, "master", net.JoinHostPort(a.MasterAddr, fmt.Sprint(a.MasterPort)))
			for id, ev := range startedEvents(a) {
				if o := s.outboxes[id]; o != nil {
					o.push(ev)
				}
			}
		case job.EndGeneration:
			// Info: the agents print the line a person reads (RestartPlanned, or the report)
			s.log.Info("generation ended", "generation", a.Generation, "reason", a.Reason)
			s.plan.ended, s.plan.world = &a, s.m.Status().WorldSize
			ev := endedEvent(a)
			for _, o := range s.outboxes {
				o.push(ev)
			}
		case job.FinishJob:
			s.result = finishedToProto(a)
			if a.Succeeded {
				s.log.Info("job finished", "message", a.Message)
			} else {
				s.log.Info("job finished", "exit_code", a.ExitCode, "message", a.Message)
			}
			ev := &gotrainv1.GenerationEvent{Event: &gotrainv1.GenerationEvent_Finished{Finished: s.result}}
			for _, o := range s.outboxes {
				o.push(ev)
				o.closed = true
			}
			if h := s.hooks.finishing; h != nil {
				h()
			}
			select {
			case <-s.finished: // a replica restoring a snapshot finishes again
			default:
				close(s.finished)
			}
		case job.HangDetected:
			s.hangDetected(a) // hang.go
		case job.ReleaseBarrier:
			for _, w := range a.Waiters {
				s.answer(w, nil)
			}
		case job.FailBarrier:
			err := status.Errorf(codes.Aborted, "barrier %q of generation %d failed: %s", a.Name, a.Generation, a.Reason)
			for _, w := range a.Waiters {
				s.answer(w, err)
			}
		default:
			s.log.Error("unknown action from the job machine", "action", fmt.Sprintf("%T", a))
		}
	}
}

// answer ends the waiting Barrier call w. s.mu is held.
func (s *Server) answer(w uint64, err error) {
	if ch, ok := s.waiters[w]; ok {
		ch <- err // buffered: never blocks
		delete(s.waiters, w)
	}
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
	host, err := s.hostJoin(req) // admit.go
	if err != nil {
		return nil, err
	}
	b, err := loggedJoin(req)
	if err != nil {
		return nil, err
	}
	csr := sha256.Sum256(req.GetCsr())
	s.mu.Lock()
	if !s.joinedBefore(req, csr[:]) { // a retry is answered as the node it joined as
		_, _, err = s.admitJoin(req, host) // a refused join leaves nothing in the log
	}
	s.mu.Unlock()
	if err != nil {
		return nil, err
	}
	r, err := s.commit(entry{Join: b, Host: host, JoinCSR: csr[:]})
	if err != nil {
		return nil, err
	}
	joined := r.(joinResult)
	var cert []byte
	if s.cfg.CA != nil {
		if cert, err = s.cfg.CA.IssueNode(joined.id, req.GetCsr()); err != nil {
			return nil, status.Errorf(codes.InvalidArgument, "join: %v", err)
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	jc := s.m.Config()
	var caCert []byte
	if s.cfg.CA != nil {
		caCert = s.cfg.CA.Cert.Raw // the key that signs leader hints (replicakeys.go)
	}
	return &gotrainv1.JoinResponse{NodeId: joined.id, RunId: jc.RunID, MaxRestarts: int32(jc.MaxRestarts), GossipPort: int32(s.gossipPort), Warnings: joined.warnings,
		NodeTimeoutMs: jc.NodeTimeout.Milliseconds(), NodeCert: cert, Replicas: s.replicaAddrs(), HostReplica: joined.hostReplica, CaCert: caCert}, nil
}

// joinResult is what applying a join gives the Join call.
type joinResult struct {
	id          string
	warnings    []string
	hostReplica bool
}

// applyJoin joins the node of req (a JoinRequest without its CSR; host:
// its agent runs the coordinator; csr: the CSR's SHA-256). Every replica
// runs it, in the log's order. s.mu is held.
func (s *Server) applyJoin(now time.Time, b []byte, host bool, csr []byte) (joinResult, error) {
	req := &gotrainv1.JoinRequest{}
	if err := proto.Unmarshal(b, req); err != nil {
		return joinResult{}, status.Errorf(codes.InvalidArgument, "join: %v", err)
	}
	key := joinKey(req, csr)
	if id, ok := s.joinKeys[key]; ok && s.m.HasNode(id) {
		// The same agent's Join again: its answer was lost (a leader
		// change after the commit, a connection that broke). It is the
		// same node, not one more, which a job at its size would refuse.
		warnings, _ := checkSettings(s.m.Config(), req.GetSettings())
		s.log.Info("node joined again (its agent did not get the answer)", "node_id", id)
		hosting := slices.Contains(slices.Collect(maps.Values(s.rs.hostOf)), id)
		return joinResult{id: id, warnings: warnings, hostReplica: slices.Contains(s.rs.asked, id) && !hosting}, nil
	}
	ev, warnings, err := s.admitJoin(req, host) // admit.go
	if err != nil {
		return joinResult{}, err
	}
	info, id := ev.Info, ev.NodeID
	for _, w := range warnings {
		s.log.Warn("join", "hostname", info.Hostname, "warning", w)
	}
	acts, err := s.m.Step(now, ev)
	if err != nil {
		s.log.Warn("join rejected", "hostname", info.Hostname, "err", err)
		return joinResult{}, grpcError(err)
	}
	s.nodeSeq++
	s.outboxes[id] = newOutbox() // before apply: the start may include this node
	if s.joinKeys == nil {
		s.joinKeys = map[string]string{}
	}
	s.joinKeys[key] = id
	s.joinedNode(id, req)
	s.log.Info("node joined", "node_id", id, "hostname", info.Hostname, "address", info.Address, "nproc", info.Nproc, "gpus", len(info.GPUs))
	s.apply(acts)
	s.tickOnDeadline()
	return joinResult{id: id, warnings: warnings, hostReplica: s.askReplica(id, info.Address)}, nil // replicated.go
}

// joinedBefore says whether req (csr: its CSR's SHA-256) is a Join of a
// node the job holds, retried by its agent. s.mu is held.
func (s *Server) joinedBefore(req *gotrainv1.JoinRequest, csr []byte) bool {
	id, ok := s.joinKeys[joinKey(req, csr)]
	return ok && s.m.HasNode(id)
}

// joinKey identifies the agent process behind a Join: its host, address,
// pid, the port it offered and its CSR's hash (csr), which a retry of the
// same Join repeats; only the holder of the CSR's key can use the node
// certificate that the retry gets.
func joinKey(req *gotrainv1.JoinRequest, csr []byte) string {
	n := req.GetNode()
	return fmt.Sprintf("%s|%s|%d|%d|%x", n.GetHostname(), n.GetAddress(), n.GetAgentPid(), n.GetFreePort(), csr)
}

// WatchGenerations streams the node's generation events. The stream is the
// node's membership: when it ends before the job finished, the node is lost.
func (s *Server) WatchGenerations(req *gotrainv1.WatchGenerationsRequest, stream grpc.ServerStreamingServer[gotrainv1.GenerationEvent]) error {
	id := req.GetNodeId()
	s.mu.Lock()
	o := s.outboxes[id]
	switch {
	case o == nil && s.result != nil:
		// The job is over (and the node may be gone): say so and end.
		res := s.result
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
	pos := min(int(req.GetAfterSeq()), len(o.events))
	if pos > 0 {
		// A stream resumed: after a blip, or at a new leader.
		s.log.Info("watch stream resumed", "node_id", id, "after_seq", pos)
	}
	if o.closed && pos == len(o.events) {
		// A new stream after the job finished and the node heard so: say
		// so again.
		res := s.result
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
		if s.rs.term != term && !s.m.Finished() {
			// This replica stopped leading: the agent goes on at the new
			// leader, from where it is.
			err := s.notLeader(stream.Context())
			s.mu.Unlock()
			s.streamEnded(id, o, my, "")
			return err
		}
		term = s.rs.term // after the end, any replica finishes the stream
		evs, closed, lost := o.events[pos:], o.closed, o.lost
		pos = len(o.events)
		s.mu.Unlock()
		if lost != "" {
			s.streamEnded(id, o, my, "")
			return status.Errorf(codes.Aborted, "this node was lost (%s); its workers must stop", lost)
		}
		for _, ev := range evs {
			if err := stream.Send(ev); err != nil {
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
		case <-o.wake:
		case <-ctx.Done():
			s.streamEnded(id, o, my, fmt.Sprintf("its agent disconnected (it exited or was killed, or the network to it failed): %v", context.Cause(ctx)))
			return status.FromContextError(ctx.Err()).Err()
		case <-s.stop.Done():
			stopping = true
		case <-s.rs.stepDown(term):
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
	if s.m.Finished() || s.stop.Err() != nil || s.outboxes[id] != o || reason == "" {
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
	if held, err := s.store(req.GetKey()).Check(req.GetKey(), req.GetValue()); err != nil {
		return nil, kvError(err) // limits.go
	} else if held {
		return &gotrainv1.KVPutResponse{}, nil
	}
	if _, err := s.commit(entry{KV: &kvEntry{Key: req.GetKey(), Value: req.GetValue()}}); err != nil {
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
	st := s.store(key)
	if err := st.CheckKey(key); err != nil {
		return nil, kvError(err)
	}
	found := func() *gotrainv1.KVGetResponse {
		v, ok := st.Get(key)
		return &gotrainv1.KVGetResponse{Found: ok, Value: v}
	}
	if req.GetWaitMs() <= 0 {
		return found(), nil
	}
	wait := maxKVWait
	if ms := req.GetWaitMs(); ms < maxKVWait.Milliseconds() {
		wait = time.Duration(ms) * time.Millisecond
	}
	ready, release := st.Watch(key)
	defer release()
	s.mu.Lock()
	stepDown := s.rs.stepDown(s.rs.term)
	s.mu.Unlock()
	timer := time.NewTimer(wait)
	defer timer.Stop()
	if h := s.hooks.kvWaiting; h != nil {
		h(key)
	}
	select {
	case <-ready:
		return found(), nil
	case <-timer.C:
		return found(), nil
	case <-ctx.Done():
		return nil, status.FromContextError(ctx.Err()).Err()
	case <-s.stop.Done():
		return nil, status.Error(codes.Unavailable, "coordinator is shutting down")
	case <-stepDown:
		return nil, s.notLeaderNow(ctx)
	}
}

// Barrier returns once every rank of the generation called it, or fails with
// Aborted when the generation ends first.
func (s *Server) Barrier(ctx context.Context, req *gotrainv1.BarrierRequest) (*gotrainv1.BarrierResponse, error) {
	ch := make(chan error, 1)
	s.mu.Lock()
	s.waiterSeq++
	w := s.waiterSeq
	s.waiters[w] = ch
	stepDown := s.rs.stepDown(s.rs.term)
	s.mu.Unlock()
	if _, err := s.commit(entry{Event: job.BarrierArrived{Name: req.GetName(), Generation: req.GetGeneration(), Rank: int(req.GetRank()), Waiter: w}}); err != nil {
		s.mu.Lock()
		delete(s.waiters, w)
		s.mu.Unlock()
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
		s.cancelWaiter(w)
		if h := s.hooks.barrierCanceled; h != nil {
			h(req.GetName(), req.GetRank())
		}
		return nil, status.FromContextError(ctx.Err()).Err()
	case <-s.stop.Done():
		s.cancelWaiter(w)
		return nil, status.Error(codes.Unavailable, "coordinator is shutting down")
	case <-stepDown:
		// The caller arrives again at the new leader; this arrival stays
		// in the replicated barrier, and its answer goes nowhere.
		s.mu.Lock()
		delete(s.waiters, w)
		s.mu.Unlock()
		return nil, s.notLeaderNow(ctx)
	}
}

func (s *Server) cancelWaiter(w uint64) {
	s.mu.Lock()
	delete(s.waiters, w)
	s.mu.Unlock()
	_, _ = s.commit(entry{Event: job.BarrierCanceled{Waiter: w}}) // never fails but for a lost leadership
}

// ReportProgress stores the progress of a node's ranks.
func (s *Server) ReportProgress(_ context.Context, req *gotrainv1.ReportProgressRequest) (*gotrainv1.ReportProgressResponse, error) {
	s.mu.Lock()
	s.heartbeat(req.GetNodeId()) // agentquorum.go
	s.mu.Unlock()
	ev := job.ProgressReported{NodeID: req.GetNodeId()}
	for _, p := range req.GetRanks() {
		ev.Ranks = append(ev.Ranks, progressFromProto(p))
	}
	if _, err := s.commit(entry{Event: ev}); err != nil {
		return nil, err
	}
	return &gotrainv1.ReportProgressResponse{}, nil
}

// ReportWorkerExit records that a worker process ended.
func (s *Server) ReportWorkerExit(_ context.Context, req *gotrainv1.ReportWorkerExitRequest) (*gotrainv1.ReportWorkerExitResponse, error) {
	if req.GetParked() {
		return s.reportParked(req)
	}
	ev := job.WorkerExited{
		NodeID:     req.GetNodeId(),
		Generation: req.GetGeneration(),
		Rank:       int(req.GetRank()),
		Pid:        int(req.GetPid()),
		ExitCode:   int(req.GetExitCode()),
		Signal:     req.GetSignal(),
		StderrTail: req.GetStderrTail(),
		OOMKilled:  req.GetOomKilled(),
		XIDErrors:  req.GetXidErrors(),
		Notes:      req.GetNotes(),
		Permanent:  req.GetPermanent(),
	}
	s.log.Debug("worker exited", "node_id", ev.NodeID, "generation", ev.Generation, "rank", ev.Rank,
		"pid", ev.Pid, "exit_code", ev.ExitCode, "signal", ev.Signal)
	if _, err := s.commit(entry{Event: ev}); err != nil {
		return nil, err
	}
	return &gotrainv1.ReportWorkerExitResponse{}, nil
}

// GetJobStatus returns a snapshot of the job.
func (s *Server) GetJobStatus(context.Context, *gotrainv1.GetJobStatusRequest) (*gotrainv1.JobStatus, error) {
	s.mu.Lock()
	st := s.m.Status()
	s.mu.Unlock()
	return statusToProto(st), nil
}

// HasNode says whether node id is in the job (tests, tools).
func (s *Server) HasNode(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.m.HasNode(id)
}
