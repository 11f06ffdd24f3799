package host

import (
	"crypto/tls"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/gotrain/gotrain/internal/coordinator"
	"github.com/gotrain/gotrain/internal/coordinator/replica"
	"github.com/gotrain/gotrain/internal/gossip"
	"github.com/gotrain/gotrain/internal/jobtls"
)

// A replicated coordinator (package coordinator's replicated.go) runs on
// several hosts: standalone, `gotrain coordinator --peers A1,A2,A3 --listen
// A1` on each (Config.Peers); embedded, the first node's agent starts one
// (Config.Replicas > 1) and the next nodes to join host the others when
// Join asks them (Config.JoinReplica). Each replica serves gRPC at its
// address (its ID), gossips at port + 1 and speaks Raft at port + 3 (+ 2 is the Slurm token exchange),
// mutually authenticated with replica certificates of the job CA. The CA
// is random: the first replica makes it, the others get it from the set
// over an authenticated channel (peerca.go; embedded, the launcher asks
// the coordinator with its node certificate), never from the job token.

// RaftPortOffset: a replica's Raft port is its gRPC port + RaftPortOffset.
const RaftPortOffset = 3

// replicasRunID is the run id of a replica set started apart (standalone,
// --peers) without --run-id: the replicas share one job CA (the first makes
// it, the others fetch it: peerca.go), so its public hash, which the join
// hint prints anyway, names the job alike on every replica and tells
// nothing of the token.
func replicasRunID(ca *jobtls.CA) string {
	h := strings.TrimPrefix(ca.Hash(), "sha256:")
	return "gotrain-" + h[:min(8, len(h))]
}

// replicated says whether cfg runs a replica of a replicated coordinator.
func (c Config) replicated() bool {
	return len(c.Peers) > 1 || c.Replicas > 1 || c.JoinReplica
}

// validateReplicas checks the replication settings.
func (c Config) validateReplicas() error {
	if len(c.Peers) == 0 {
		return nil
	}
	for _, p := range c.Peers {
		if _, port, err := net.SplitHostPort(p); err != nil || port == "0" {
			return &ConfigError{Msg: fmt.Sprintf("--peers: %q", p), Hint: "Give each replica's HOST:PORT (its --listen), e.g. --peers 10.0.0.1:29400,10.0.0.2:29400,10.0.0.3:29400."}
		}
	}
	if !slices.Contains(c.Peers, c.Listen) {
		return &ConfigError{Msg: fmt.Sprintf("%s %s is not among --peers %v", c.ListenFlag, c.Listen, c.Peers),
			Hint: "Start each replica with --listen set to its own entry of --peers (the same list on every replica)."}
	}
	if len(c.Peers)%2 == 0 {
		return &ConfigError{Msg: fmt.Sprintf("--peers lists %d replicas", len(c.Peers)), Hint: "Give an odd number (3 or 5): an even one survives no more losses than one fewer."}
	}
	return nil
}

// raftAddr is the Raft address of the replica serving gRPC at addr.
func raftAddr(addr string) (string, error) {
	h, p, err := net.SplitHostPort(addr)
	if err != nil {
		return "", err
	}
	n, err := strconv.Atoi(p)
	if err != nil {
		return "", err
	}
	if n == 0 {
		return net.JoinHostPort(h, "0"), nil
	}
	return net.JoinHostPort(h, strconv.Itoa(n+RaftPortOffset)), nil
}

// gossipAddr is the gossip address of the replica serving gRPC at addr
// (port + 1, the default).
func gossipAddr(addr string) string {
	h, p, err := net.SplitHostPort(addr)
	if err != nil {
		return ""
	}
	n, _ := strconv.Atoi(p)
	return net.JoinHostPort(h, strconv.Itoa(n+1))
}

// replicaID is the address others reach this replica at: the listening
// address, or the advertised host at its port when it listens on all
// interfaces.
func (c *Coordinator) replicaID() (string, error) {
	if !c.addr.IP.IsUnspecified() {
		return c.addr.String(), nil
	}
	if c.cfg.AdvertiseAddr == nil {
		return "", fmt.Errorf("a replica listening on all interfaces needs an address to advertise (set %s to this host's address)", c.cfg.ListenFlag)
	}
	host, err := c.cfg.AdvertiseAddr()
	if err != nil {
		return "", err
	}
	return net.JoinHostPort(host, strconv.Itoa(c.addr.Port)), nil
}

// startReplica starts this host's replica of the coordinator and hands it
// to the server.
func (c *Coordinator) startReplica(srv *coordinator.Server) error {
	id, err := c.replicaID()
	if err != nil {
		return err
	}
	// Raft at the gRPC port + RaftPortOffset; at any free port when the
	// gRPC port was any free one (tests).
	bindHost, listenPort, _ := net.SplitHostPort(c.cfg.Listen)
	advHost, _, _ := net.SplitHostPort(id)
	raftBind, raftAdv := net.JoinHostPort(bindHost, "0"), ""
	if listenPort != "0" {
		if raftAdv, err = raftAddr(id); err != nil {
			return err
		}
		_, p, _ := net.SplitHostPort(raftAdv)
		raftBind = net.JoinHostPort(bindHost, p)
	}
	var peers []replica.Peer
	for _, p := range c.cfg.Peers {
		ra, err := raftAddr(p)
		if err != nil {
			return err
		}
		peers = append(peers, replica.Peer{ID: p, RaftAddr: ra})
	}
	var srvTLS, cliTLS *tls.Config
	if c.ca != nil {
		cert, err := c.ca.ReplicaCertificate(id, []string{advHost})
		if err != nil {
			return err
		}
		srvTLS, cliTLS = jobtls.ReplicaTLS(c.ca, cert)
	}
	n, err := replica.Start(replica.Config{
		ID: id, RaftBind: raftBind, RaftAdvertise: raftAdv,
		Peers: peers, Alone: len(peers) == 0 && !c.cfg.JoinReplica,
		ServerTLS: srvTLS, ClientTLS: cliTLS, FSM: srv.FSM(), Logger: c.cfg.Logger.With("component", "replica"),
		MaxLogBytes:      c.cfg.maxRaftLog,
		HeartbeatTimeout: replica.TimeoutFor(c.cfg.NodeTimeout), ElectionTimeout: replica.TimeoutFor(c.cfg.NodeTimeout),
	})
	if err != nil {
		return err
	}
	c.replica = n
	srv.UseReplica(n, coordinator.ReplicaConfig{Peers: c.cfg.Peers, Want: c.cfg.Replicas, Hosted: c.cfg.JoinReplica})
	return nil
}

// gossipJoin is what this replica's gossip joins: the other replicas'.
func (c Config) gossipJoin(self string) []string {
	out := slices.Clone(c.GossipJoin)
	for _, p := range c.Peers {
		if p != self {
			out = append(out, gossipAddr(p))
		}
	}
	return out
}

// gossipName is this coordinator's member name.
func (c *Coordinator) gossipName() string {
	if c.replica == nil {
		return gossip.CoordinatorName
	}
	return gossip.ReplicaName(c.replica.ID())
}

// ReplicaID is this replica's gRPC address (what agents call it at); ""
// when the coordinator is not replicated.
func (c *Coordinator) ReplicaID() string {
	if c.replica == nil {
		return ""
	}
	return c.replica.ID()
}

// RaftAddr is where this replica's Raft listens; "" when not replicated.
func (c *Coordinator) RaftAddr() string {
	if c.replica == nil {
		return ""
	}
	return c.replica.RaftAddr()
}

// Leaderless is how long this replica has known no leader (0 while it
// knows one, or when the coordinator is not replicated).
func (c *Coordinator) Leaderless() time.Duration {
	if c.replica == nil || c.replica.Leader() != "" {
		return 0
	}
	return time.Since(c.replica.LastContact())
}
