package launcher

import (
	"net"
	"strconv"
	"time"

	"github.com/gotrain/gotrain/internal/gossip"
)

// startGossip joins the coordinator's member list as this node (named by its
// node id), so that the coordinator learns within seconds when this agent
// stops answering. The coordinator is reached on the host this agent dialed
// it at, at the gossip port Join returned (0: the job does not gossip).
func (a *agent) startGossip(coordAddr string) (stop func()) {
	if a.cfg.NoGossip || a.gossipPort == 0 {
		return func() {}
	}
	if a.joinedAt != "" {
		coordAddr = a.joinedAt // the replica that answered Join: its gossip port is gossipPort
	}
	host, _, err := net.SplitHostPort(coordAddr)
	if err != nil {
		a.log.Warn("no gossip", "err", err)
		return func() {}
	}
	ml, err := gossip.Start(gossip.Options{
		Name: a.nodeID, BindAddr: a.cfg.NodeAddress, Port: a.cfg.GossipPort,
		Token: a.cfg.JobToken, Logger: a.log.With("component", "gossip"),
	})
	if err != nil {
		a.log.Warn("no gossip: the coordinator finds this node lost by its stream only", "err", err)
		return func() {}
	}
	// The coordinator (each of its replicas) at the host this agent dialed
	// it at, at the gossip port Join returned; other replicas at their
	// port + 1 (the default).
	peers := []string{net.JoinHostPort(host, strconv.Itoa(a.gossipPort))}
	for _, r := range a.replicaSet() {
		if h, p, err := net.SplitHostPort(r); err == nil && h != host {
			if n, err := strconv.Atoi(p); err == nil {
				peers = append(peers, net.JoinHostPort(h, strconv.Itoa(n+1)))
			}
		}
	}
	// The member list stays up while the agent lives, joined or not: the
	// coordinator takes a refused connection at its port for a dead agent
	// (internal/coordinator/reach.go).
	stopJoining := gossip.KeepJoining(ml, peers, gossipRejoinEvery, a.log.With("component", "gossip"))
	// No Leave on the way out: the coordinator cannot tell a leave from a
	// death (internal/coordinator/gossip.go), and the watch stream ending says first
	// that this agent went.
	return func() {
		stopJoining()
		_ = ml.Shutdown()
	}
}

// gossipRejoinEvery is the pause between tries to join the member list.
const gossipRejoinEvery = 2 * time.Second
