// Package replica replicates a deterministic state machine over a few
// hosts with Raft (github.com/hashicorp/raft), for the job coordinator: the
// leader proposes entries, every replica applies them in the same order,
// and losing a minority of replicas — or the leader — loses nothing.
//
// hashicorp/raft rather than go.etcd.io/raft: it brings the transport,
// elections, log replication and membership changes as one library (Consul,
// Nomad and Vault run on it), where etcd's raft is a core that leaves the
// network, storage and ticking to the caller. The coordinator's state is
// small and lives in memory: logs and snapshots are kept in memory, the log
// bounded in bytes and compacted by snapshots (logsize.go), and a replica
// that restarts joins as a new one.
//
// A replica's ID is the address clients reach it at (its gRPC HOST:PORT),
// so that a follower can name the leader to a client.
//
// # Usage
//
//	n, err := replica.Start(replica.Config{ID: "10.0.0.1:29400", RaftBind: "10.0.0.1:29402",
//		Peers: peers, FSM: fsm, ServerTLS: s, ClientTLS: c})
//	if err != nil { ... }
//	defer n.Stop()
//	resp, err := n.Propose(entry) // on the leader; ErrNotLeader elsewhere
package replica

import (
	"cmp"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
)

// Default timeouts. Raft's own defaults (1 s heartbeat and election
// timeouts) put a leader change at 2–4 s. A follower starts an election
// after a randomised 1–2 heartbeat timeouts without the leader: 700 ms
// gave 1.3–2.4 s from a lost leader to agents served by a new one on a
// loaded 2-core machine (bench/results/coordinator-failover-2026-12-01.md);
// 500 ms is the floor. The leader's lease (how long it leads without
// hearing a majority) equals the heartbeat timeout: 250 ms made leaders on a
// loaded 2-core host step down for nothing.
//
// A job's replicas take theirs from its node timeout (TimeoutFor, 1 s at
// the default 10 s): on a host whose cores the training saturates
// (data-loader workers, a build beside), 500 ms gave a leader change for
// nothing within two minutes.
const (
	DefaultHeartbeatTimeout = 500 * time.Millisecond
	DefaultElectionTimeout  = 500 * time.Millisecond
	maxRaftTimeout          = 2 * time.Second
	applyTimeout            = 10 * time.Second
	dialTimeout             = 2 * time.Second
)

// TimeoutFor is the heartbeat and election timeout for the replicas of a
// job whose nodes are lost after nodeTimeout: a tenth of it, at least the
// default and at most 2 s. A replica set then rides out a stall of its
// host's scheduler ten times shorter than what would lose a node, and a
// leader's death is seen in 1–2 timeouts (1–2 s at the default 10 s node
// timeout), well inside the node timeout the agents wait through.
func TimeoutFor(nodeTimeout time.Duration) time.Duration {
	return min(max(nodeTimeout/10, DefaultHeartbeatTimeout), maxRaftTimeout)
}

// ErrNotLeader: this replica is not the leader. Leader says who is ("" when
// no leader is known: an election is under way, or no majority is left).
type ErrNotLeader struct{ Self, Leader string }

func (e *ErrNotLeader) Error() string {
	if e.Leader == "" {
		return fmt.Sprintf("coordinator replica %s is not the leader and knows of none (an election is under way, or a majority of the replicas is unreachable)", e.Self)
	}
	return fmt.Sprintf("coordinator replica %s is not the leader; the leader is at %s", e.Self, e.Leader)
}

// FSM is the replicated state machine. Apply must be deterministic: the
// same entries in the same order give the same state on every replica.
type FSM interface {
	// Apply applies one entry; what it returns is Propose's answer on the
	// replica that proposed it.
	Apply(entry []byte) any
	// Snapshot returns the whole state; Restore replaces the state with a
	// snapshot's.
	Snapshot() ([]byte, error)
	Restore(snapshot []byte) error
}

// Peer is one replica of the set: its ID (gRPC address) and Raft address.
type Peer struct{ ID, RaftAddr string }

// Config configures a replica.
type Config struct {
	// ID is this replica's gRPC address (HOST:PORT); required.
	ID string
	// RaftBind is the HOST:PORT Raft listens on; RaftAdvertise the address
	// the others reach it at (default: RaftBind's listening address).
	RaftBind, RaftAdvertise string
	// Peers, when not empty, is the whole replica set (this one included)
	// to start with: every replica of a standalone set is given the same.
	// Empty: this replica waits to be added by the leader (AddVoter), or,
	// with Alone, starts a set of its own.
	Peers []Peer
	Alone bool
	// ServerTLS and ClientTLS secure Raft's traffic (mutual TLS among
	// replicas: jobtls.ReplicaTLS); nil is plaintext (tests).
	ServerTLS, ClientTLS *tls.Config
	FSM                  FSM
	Logger               *slog.Logger
	// Timeouts; zero: the defaults above.
	HeartbeatTimeout, ElectionTimeout time.Duration
	// MaxLogBytes and MaxEntryBytes bound the log (logsize.go); zero:
	// DefaultMaxLogBytes, DefaultMaxEntryBytes.
	MaxLogBytes   int64
	MaxEntryBytes int
}

// Node is a running replica.
type Node struct {
	id        string
	r         *raft.Raft
	trans     *raft.NetworkTransport
	stream    *tlsStream
	log       *slog.Logger
	notify    chan bool
	started   time.Time
	heartbeat time.Duration
	logs      *sizedLog     // logsize.go
	compact   chan struct{} // the log passed its bound
	maxEntry  int

	mu        sync.Mutex
	leading   bool
	listeners []func(leading bool)
	snapshots int // taken for the log's size
	done      chan struct{}
	wg        sync.WaitGroup
}

// Start starts a replica. On error nothing is left running.
func Start(cfg Config) (*Node, error) {
	if cfg.ID == "" || cfg.FSM == nil {
		return nil, errors.New("replica: ID and FSM are required")
	}
	logger := cfg.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	lis, err := net.Listen("tcp", cfg.RaftBind)
	if err != nil {
		return nil, fmt.Errorf("replica: listen for Raft on %s: %w (choose another port)", cfg.RaftBind, err)
	}
	adv := cfg.RaftAdvertise
	if adv == "" {
		adv = lis.Addr().String()
	}
	advAddr, err := net.ResolveTCPAddr("tcp", adv)
	if err != nil {
		_ = lis.Close()
		return nil, fmt.Errorf("replica: Raft address %q: %w", adv, err)
	}
	// Bounded, with TLS per connection (bounds.go).
	stream := &tlsStream{Listener: guardedListener(lis, logger), advertise: advAddr, server: cfg.ServerTLS, client: cfg.ClientTLS}
	hl := hclog.New(&hclog.LoggerOptions{Name: "raft", Level: hclog.Info, Output: slogWriter{logger}})
	trans := raft.NewNetworkTransportWithConfig(&raft.NetworkTransportConfig{Stream: stream, MaxPool: 3, Timeout: 5 * time.Second, Logger: hl})

	rc := raft.DefaultConfig()
	rc.LocalID = raft.ServerID(cfg.ID)
	rc.HeartbeatTimeout = orDefault(cfg.HeartbeatTimeout, DefaultHeartbeatTimeout)
	rc.ElectionTimeout = orDefault(cfg.ElectionTimeout, DefaultElectionTimeout)
	// The lease (how long a leader leads without hearing a majority) grows
	// with the heartbeat: a leader on a stalled host keeps its lead
	// through what its followers would wait through.
	rc.LeaderLeaseTimeout = rc.HeartbeatTimeout
	rc.Logger = hl
	// The log is bounded and compacted by snapshots (logsize.go); the
	// snapshot store keeps the latest one only.
	rc.SnapshotThreshold, rc.SnapshotInterval, rc.TrailingLogs = snapshotThreshold, snapshotInterval, trailingLogs
	n := &Node{id: cfg.ID, trans: trans, stream: stream, log: logger, notify: make(chan bool, 16), done: make(chan struct{}), started: time.Now(),
		compact: make(chan struct{}, 1), maxEntry: cmp.Or(cfg.MaxEntryBytes, DefaultMaxEntryBytes)}
	rc.NotifyCh = n.notify
	n.heartbeat = rc.HeartbeatTimeout
	stable := raft.NewInmemStore()
	n.logs = &sizedLog{s: raft.NewInmemStore(), bound: cmp.Or(cfg.MaxLogBytes, DefaultMaxLogBytes), over: func() {
		select {
		case n.compact <- struct{}{}:
		default:
		}
	}}
	snaps := raft.NewInmemSnapshotStore()
	r, err := raft.NewRaft(rc, fsmAdapter{cfg.FSM}, n.logs, stable, snaps, trans)
	if err != nil {
		_ = trans.Close()
		return nil, fmt.Errorf("replica: start Raft: %w", err)
	}
	n.r = r
	var servers []raft.Server
	for _, p := range cfg.Peers {
		servers = append(servers, raft.Server{Suffrage: raft.Voter, ID: raft.ServerID(p.ID), Address: raft.ServerAddress(p.RaftAddr)})
	}
	if len(servers) == 0 && cfg.Alone {
		servers = []raft.Server{{Suffrage: raft.Voter, ID: rc.LocalID, Address: trans.LocalAddr()}}
	}
	if len(servers) > 0 {
		if err := r.BootstrapCluster(raft.Configuration{Servers: servers}).Error(); err != nil && !errors.Is(err, raft.ErrCantBootstrap) {
			n.Stop()
			return nil, fmt.Errorf("replica: bootstrap: %w", err)
		}
	}
	n.wg.Add(2)
	go n.watchLeadership()
	go n.compactLoop() // logsize.go
	return n, nil
}

func orDefault(d, def time.Duration) time.Duration {
	if d <= 0 {
		return def
	}
	return d
}

// watchLeadership passes Raft's leadership changes to the listeners.
func (n *Node) watchLeadership() {
	defer n.wg.Done()
	for {
		select {
		case <-n.done:
			return
		case leading := <-n.notify:
			n.mu.Lock()
			n.leading = leading
			ls := append([]func(bool){}, n.listeners...)
			n.mu.Unlock()
			n.log.Info("coordinator replica", "leader", leading, "replica", n.id)
			for _, f := range ls {
				f(leading)
			}
		}
	}
}

// OnLeadership registers f, called (from one goroutine, in order) each
// time this replica becomes the leader (true) or stops being it (false).
func (n *Node) OnLeadership(f func(leading bool)) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.listeners = append(n.listeners, f)
}

// ID is this replica's ID (its gRPC address).
func (n *Node) ID() string { return n.id }

// RaftAddr is where this replica's Raft listens.
func (n *Node) RaftAddr() string { return string(n.trans.LocalAddr()) }

// Term is Raft's current term here (a leader hint names it).
func (n *Node) Term() uint64 { return n.r.CurrentTerm() }

// Leading says whether this replica is the leader now.
func (n *Node) Leading() bool { return n.r.State() == raft.Leader }

// Leader is the leader's ID, "" when none is known: also when this
// follower has not heard from the one it knew for a heartbeat timeout (it
// may be dead; naming it would send clients back and forth).
func (n *Node) Leader() string {
	_, id := n.r.LeaderWithID()
	if id == "" || n.Leading() || time.Since(n.r.LastContact()) <= n.heartbeat {
		return string(id)
	}
	return ""
}

// Propose replicates entry and applies it (FSM.Apply) once a majority has
// it; it returns what Apply returned on this replica. Only the leader
// proposes: elsewhere it returns *ErrNotLeader at once.
func (n *Node) Propose(entry []byte) (any, error) {
	if len(entry) > n.maxEntry {
		return nil, fmt.Errorf("%w: %d bytes, at most %d", ErrEntryTooLarge, len(entry), n.maxEntry)
	}
	f := n.r.Apply(entry, applyTimeout)
	if err := f.Error(); err != nil {
		if errors.Is(err, raft.ErrNotLeader) || errors.Is(err, raft.ErrLeadershipLost) || errors.Is(err, raft.ErrLeadershipTransferInProgress) {
			return nil, &ErrNotLeader{Self: n.id, Leader: n.Leader()}
		}
		return nil, fmt.Errorf("replicate: %w", err)
	}
	return f.Response(), nil
}

// AddVoter adds a replica to the set (on the leader).
func (n *Node) AddVoter(p Peer) error {
	if err := n.r.AddVoter(raft.ServerID(p.ID), raft.ServerAddress(p.RaftAddr), 0, applyTimeout).Error(); err != nil {
		if errors.Is(err, raft.ErrNotLeader) {
			return &ErrNotLeader{Self: n.id, Leader: n.Leader()}
		}
		return fmt.Errorf("add replica %s (Raft at %s): %w", p.ID, p.RaftAddr, err)
	}
	return nil
}

// TransferLeadership hands the lead to the most up-to-date follower (on
// the leader; hashicorp/raft's LeadershipTransfer), and returns once it
// has, or failed.
func (n *Node) TransferLeadership() error {
	if err := n.r.LeadershipTransfer().Error(); err != nil {
		return fmt.Errorf("hand the lead over: %w", err)
	}
	return nil
}

// RemoveVoter takes a replica out of the set (on the leader).
func (n *Node) RemoveVoter(id string) error {
	if err := n.r.RemoveServer(raft.ServerID(id), 0, applyTimeout).Error(); err != nil {
		if errors.Is(err, raft.ErrNotLeader) {
			return &ErrNotLeader{Self: n.id, Leader: n.Leader()}
		}
		return fmt.Errorf("remove replica %s: %w", id, err)
	}
	return nil
}

// Peers is the replica set as this replica knows it.
func (n *Node) Peers() []Peer {
	f := n.r.GetConfiguration()
	if f.Error() != nil {
		return nil
	}
	var ps []Peer
	for _, s := range f.Configuration().Servers {
		ps = append(ps, Peer{ID: string(s.ID), RaftAddr: string(s.Address)})
	}
	return ps
}

// stopLinger is how long a leader that stops still serves Raft: followers
// learn the commit index of the last entries (the job's end) from its next
// replication round (every CommitTimeout, 50 ms) — without it, a leader
// stopping right after the end left followers waiting for a leader.
const stopLinger = 200 * time.Millisecond

// Stop stops the replica and waits for its goroutines.
func (n *Node) Stop() {
	select {
	case <-n.done:
		return
	default:
	}
	if n.r != nil && n.Leading() {
		time.Sleep(stopLinger)
	}
	if n.r != nil {
		_ = n.r.Shutdown().Error()
	}
	// Close leaves the pooled connections to the peers open (raft closes
	// them only in CloseStreams): each would hold a socket here and a
	// goroutine reading it at the peer until this process exits.
	n.trans.CloseStreams()
	_ = n.trans.Close()
	close(n.done)
	n.wg.Wait()
}

// fsmAdapter turns FSM into raft.FSM.
type fsmAdapter struct{ f FSM }

func (a fsmAdapter) Apply(l *raft.Log) any {
	if l.Type != raft.LogCommand {
		return nil
	}
	return a.f.Apply(l.Data)
}

func (a fsmAdapter) Snapshot() (raft.FSMSnapshot, error) {
	b, err := a.f.Snapshot()
	if err != nil {
		return nil, err
	}
	return snapshot(b), nil
}

func (a fsmAdapter) Restore(rc io.ReadCloser) error {
	defer rc.Close()
	b, err := io.ReadAll(io.LimitReader(rc, MaxSnapshotBytes+1))
	if err != nil {
		return err
	}
	if int64(len(b)) > MaxSnapshotBytes {
		return fmt.Errorf("replica: a snapshot over %d bytes: not one of ours", MaxSnapshotBytes)
	}
	return a.f.Restore(b)
}

type snapshot []byte

func (s snapshot) Persist(sink raft.SnapshotSink) error {
	if _, err := sink.Write(s); err != nil {
		_ = sink.Cancel()
		return err
	}
	return sink.Close()
}

func (snapshot) Release() {}

// tlsStream is Raft's network layer: TCP, with mutual TLS when configured.
// (raft ships a TCP layer only; its TLS is left to the caller.)
type tlsStream struct {
	net.Listener
	advertise      net.Addr
	server, client *tls.Config
}

func (s *tlsStream) Addr() net.Addr { return s.advertise }

func (s *tlsStream) Dial(addr raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	d := &net.Dialer{Timeout: min(timeout, dialTimeout)}
	if s.client == nil {
		return d.Dial("tcp", string(addr))
	}
	return tls.DialWithDialer(d, "tcp", string(addr), s.client)
}

// slogWriter passes Raft's log lines to slog at debug level: a peer that
// is down makes Raft log an error per retry; what matters (who leads) is
// logged by watchLeadership.
type slogWriter struct{ log *slog.Logger }

func (w slogWriter) Write(p []byte) (int, error) {
	w.log.Debug(strings.TrimSpace(string(p)), "component", "raft")
	return len(p), nil
}

// Barrier returns once every entry committed before it is applied here (on
// the leader: what a new leader waits for before it acts).
func (n *Node) Barrier() error {
	if err := n.r.Barrier(applyTimeout).Error(); err != nil {
		if errors.Is(err, raft.ErrNotLeader) || errors.Is(err, raft.ErrLeadershipLost) {
			return &ErrNotLeader{Self: n.id, Leader: n.Leader()}
		}
		return err
	}
	return nil
}

// LastContact is when this replica last heard from a leader (now, on the
// leader; its start when it has heard none yet).
func (n *Node) LastContact() time.Time {
	if n.Leading() {
		return time.Now()
	}
	if t := n.r.LastContact(); t.After(n.started) {
		return t
	}
	return n.started
}
