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
	peer := net.JoinHostPort(host, strconv.Itoa(a.gossipPort))
	// The member list stays up while the agent lives, joined or not: the
	// coordinator takes a refused connection at its port for a dead agent
	// (coordinator/reach.go). A join that fails (an overloaded machine
	// misses its deadline) is tried again until it works.
	quit, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for warned := false; ; {
			_, err := ml.Join([]string{peer})
			if err == nil {
				a.log.Info("gossip joined", "peer", peer, "local", net.JoinHostPort(ml.LocalNode().Addr.String(), strconv.Itoa(int(ml.LocalNode().Port))))
				return
			}
			if !warned {
				warned = true
				a.log.Warn("gossip: cannot join the coordinator's member list yet (is its UDP/TCP gossip port open?); trying again", "peer", peer, "err", err)
			}
			select {
			case <-quit:
				return
			case <-time.After(gossipRejoinEvery):
			}
		}
	}()
	// No Leave on the way out: the coordinator cannot tell a leave from a
	// death (coordinator/gossip.go), and the watch stream ending says first
	// that this agent went.
	return func() {
		close(quit)
		<-done
		_ = ml.Shutdown()
	}
}

// gossipRejoinEvery is the pause between tries to join the member list.
const gossipRejoinEvery = 2 * time.Second
