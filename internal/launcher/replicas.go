package launcher

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gotrain/gotrain/internal/coordinator/host"
	"github.com/gotrain/gotrain/internal/leaderconn"
	gotrainv1 "github.com/gotrain/gotrain/proto/gotrain/v1"
)

// The coordinator may be replicated (internal/coordinator/host's replicas.go): the
// agent then talks to its leader through a leaderconn.Conn, which follows
// leader changes; it learns the replica set at Join and from the watch
// stream, resumes the stream after the last event it got (lastSeq), and,
// when Join asks, hosts a replica itself.

// replicaView is what an agent knows of the coordinator's replicas.
type replicaView struct {
	lc          *leaderconn.Conn // the connection a.coord calls through
	replicas    []string         // the replica set (gRPC addresses), from Join and Replicas events
	hostReplica bool             // Join asked this node to host a replica
	joinedAt    string           // the replica that answered Join
	lastSeq     atomic.Uint64    // the seq of the last event received
	streams     atomic.Uint64    // counts the watch streams opened (WatchGenerationsRequest.stream)
	replicaMu   sync.Mutex       // guards replicas, stopReplica and hosting
	stopReplica func()           // stops the replica this node hosts; nil when none
	hosting     bool             // a replica is started (or being started) here
	failover    failoverNote     // the leader change in progress (failover.go)
	replicaWG   sync.WaitGroup   // replaceReplica's starts
}

// splitAddrs reads --coordinator: one HOST:PORT, or several (the replicas
// of a replicated coordinator) separated by commas.
func splitAddrs(s string) []string {
	var out []string
	for _, a := range strings.Split(s, ",") {
		if a = strings.TrimSpace(a); a != "" && !slices.Contains(out, a) {
			out = append(out, a)
		}
	}
	return out
}

// learnReplicas records the replica set and points the connection at all
// of it.
func (a *agent) learnReplicas(addrs []string) {
	if len(addrs) == 0 {
		return
	}
	a.replicaMu.Lock()
	a.replicas = slices.Clone(addrs)
	a.replicaMu.Unlock()
	if a.lc != nil {
		a.lc.SetAddrs(addrs)
	}
}

// replicaSet is the replica set as this agent knows it.
func (a *agent) replicaSet() []string {
	a.replicaMu.Lock()
	defer a.replicaMu.Unlock()
	return slices.Clone(a.replicas)
}

// hostReplica starts the replica of the coordinator that Join asked this
// node to host and has the leader add it. A replica that cannot start or
// be added costs the job one replica: it is a warning, not an error.
func (a *agent) startHostedReplica(ctx context.Context, joinedAt string) {
	a.replicaMu.Lock()
	if a.hosting {
		a.replicaMu.Unlock()
		return
	}
	a.hosting = true
	a.replicaMu.Unlock()
	cfg := a.coordinatorConfig() // coordinator.go
	cfg.JoinReplica = true
	// Its gossip joins the others': the one Join answered at (at the port
	// Join named), and every replica at its port + 1.
	if h, _, err := net.SplitHostPort(joinedAt); err == nil && a.gossipPort != 0 {
		cfg.GossipJoin = []string{net.JoinHostPort(h, strconv.Itoa(a.gossipPort))}
	}
	for _, r := range a.replicaSet() {
		if h, p, err := net.SplitHostPort(r); err == nil {
			if n, err := strconv.Atoi(p); err == nil {
				cfg.GossipJoin = append(cfg.GossipJoin, net.JoinHostPort(h, strconv.Itoa(n+1)))
			}
		}
	}
	// The replica's CA is the set's: handed over this node's own
	// connection, to this node only (keys.go), never derived.
	cactx, cacancel := context.WithTimeout(ctx, 30*time.Second)
	ca, err := a.replicaCA(cactx)
	cacancel()
	if err != nil {
		fmt.Fprintf(a.cfg.Stderr, "gotrain: warning: this node was asked to host a replica of the coordinator and did not get the job CA: %v (the job goes on with fewer replicas)\n", err)
		return
	}
	cfg.CA = ca
	c, err := host.Start(context.WithoutCancel(ctx), cfg)
	if err != nil {
		fmt.Fprintf(a.cfg.Stderr, "gotrain: warning: this node was asked to host a replica of the coordinator and cannot: %v (the job goes on with fewer replicas)\n", err)
		return
	}
	actx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	_, err = a.coord.AddReplica(actx, &gotrainv1.AddReplicaRequest{NodeId: a.nodeID, Addr: c.ReplicaID(), RaftAddr: c.RaftAddr()})
	if err != nil {
		_ = c.Stop()
		fmt.Fprintf(a.cfg.Stderr, "gotrain: warning: the coordinator did not take this node's replica at %s: %v (the job goes on with fewer replicas)\n", c.ReplicaID(), err)
		return
	}
	fmt.Fprintf(a.cfg.Stderr, "gotrain: this node hosts a replica of the coordinator at %s\n", c.ReplicaID())
	a.replicaMu.Lock()
	a.stopReplica = func() {
		if err := c.Stop(); err != nil {
			a.log.Warn("coordinator replica", "err", err)
		}
	}
	a.replicaMu.Unlock()
}

// replaceReplica: the coordinator asks this node to host a replica in
// place of one lost with its node.
func (a *agent) replaceReplica(ctx context.Context) {
	a.replicaWG.Go(func() { a.startHostedReplica(ctx, a.lc.Leader()) })
}

// coordConn is the agent's connection to the coordinator, and the replica
// it hosts: Close ends both.
type coordConn struct{ a *agent }

func (c coordConn) Close() error {
	c.a.replicaWG.Wait() // a replica being started is stopped below, not left behind
	err := c.a.lc.Close()
	c.a.replicaMu.Lock()
	stop := c.a.stopReplica
	c.a.replicaMu.Unlock()
	if stop != nil {
		stop()
	}
	return err
}

// coordinatorAddrs is where local tools (gotrain diagnose, top) reach the
// coordinator: addr, and every replica this agent knows of.
func (a *agent) coordinatorAddrs(addr string) string {
	all := splitAddrs(addr)
	for _, r := range a.replicaSet() {
		if !slices.Contains(all, r) {
			all = append(all, r)
		}
	}
	return strings.Join(all, ",")
}
