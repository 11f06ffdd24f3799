package coordinator

import (
	"fmt"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/gotrain/gotrain/internal/coordinator/job"
	"github.com/gotrain/gotrain/internal/gossip"
)

// GossipConfig is where the coordinator's memberlist node listens.
type GossipConfig struct {
	// BindAddr is the host to listen on (UDP and TCP), e.g. the
	// coordinator's listen host.
	BindAddr string
	// Port is the port; 0 picks a free one. Agents learn it from Join.
	Port int
	// AdvertiseAddr is the address the agents reach the coordinator at
	// (default BindAddr; set it when BindAddr is 0.0.0.0).
	AdvertiseAddr string
	// Name is the member name (default gossip.CoordinatorName; a replica's
	// is gossip.ReplicaName), and Join the other replicas' gossip
	// addresses, joined (and tried again) so that every replica sees every
	// agent.
	Name string
	Join []string
}

// StartGossip runs the coordinator's memberlist node, which the agents join
// after Join (JoinResponse.gossip_port), so that a node whose agent stops
// answering is lost within seconds (package internal/gossip), also when its
// watch stream stays open. Call it before Serve; stop leaves the member
// list. Without StartGossip the job does not gossip.
func (s *Server) StartGossip(cfg GossipConfig) (port int, stop func(), err error) {
	d := &gossipEvents{s: s, now: time.Now, heard: map[string]time.Time{}, addrs: map[string]string{}}
	name := cfg.Name
	if name == "" {
		name = gossip.CoordinatorName
	}
	ml, err := gossip.Start(gossip.Options{
		Name: name, BindAddr: cfg.BindAddr, Port: cfg.Port, AdvertiseAddr: cfg.AdvertiseAddr,
		Token: s.cfg.Token, Events: d, Ping: d, Logger: s.log.With("component", "gossip"),
	})
	if err != nil {
		return 0, nil, err
	}
	port = int(ml.LocalNode().Port)
	s.mu.Lock()
	s.gossipPort, s.gossip = port, d
	s.mu.Unlock()
	s.log.Info("gossip serving", "addr", net.JoinHostPort(ml.LocalNode().Addr.String(), fmt.Sprint(port)))
	stopJoining := func() {}
	if len(cfg.Join) > 0 {
		stopJoining = gossip.KeepJoining(ml, cfg.Join, 2*time.Second, s.log.With("component", "gossip"))
	}
	return port, func() {
		stopJoining()
		s.mu.Lock()
		s.gossipPort = 0
		s.mu.Unlock()
		_ = ml.Shutdown() // no Leave: agents act on nothing the coordinator says by gossip
	}, nil
}

// gossipEvents turns the coordinator's member list into NodeLost events.
// memberlist calls it from its own goroutines.
type gossipEvents struct {
	s   *Server
	now func() time.Time

	mu    sync.Mutex
	heard map[string]time.Time // when each member last answered (or joined)
	addrs map[string]string    // each member's gossip address (HOST:PORT)
}

var (
	_ memberlist.EventDelegate = (*gossipEvents)(nil)
	_ memberlist.PingDelegate  = (*gossipEvents)(nil)
)

// NotifyJoin: a member joined, or one declared dead answers again.
func (d *gossipEvents) NotifyJoin(n *memberlist.Node) {
	d.mu.Lock()
	if d.addrs == nil {
		d.addrs = map[string]string{}
	}
	d.addrs[n.Name] = net.JoinHostPort(n.Addr.String(), strconv.Itoa(int(n.Port)))
	d.mu.Unlock()
	d.heardFrom(n.Name)
	d.s.gossipSays(n.Name, false, "")
}

func (d *gossipEvents) NotifyUpdate(n *memberlist.Node) { d.heardFrom(n.Name) }

// addr returns member name's gossip address, "" when unknown.
func (d *gossipEvents) addr(name string) string {
	if d == nil {
		return ""
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.addrs[name]
}

func (d *gossipEvents) NotifyLeave(n *memberlist.Node) {
	now := d.now()
	d.mu.Lock()
	last, ok := d.heard[n.Name]
	delete(d.heard, n.Name)
	d.mu.Unlock()
	var silent time.Duration
	if ok {
		silent = now.Sub(last)
	}
	if ev, lost := gossipLost(n.Name, n.State, n.Addr.String(), silent); lost {
		d.s.gossipSays(ev.NodeID, true, ev.Reason)
	}
}

func (d *gossipEvents) AckPayload() []byte { return nil }

func (d *gossipEvents) NotifyPingComplete(n *memberlist.Node, _ time.Duration, _ []byte) {
	d.heardFrom(n.Name)
}

func (d *gossipEvents) heardFrom(name string) {
	now := d.now()
	d.mu.Lock()
	d.heard[name] = now
	d.mu.Unlock()
}

// gossipLost maps a member that left the list to the machine's event: an
// agent declared dead is a lost node; the coordinator itself is not, nor a
// member marked as having left on purpose. memberlist v0.7 hands
// NotifyLeave a Node whose State is still the one it joined with (the
// dead/left state lives in its private nodeState), so agents never Leave
// (they only shut down: their watch stream says they went) and every leave
// of an agent counts as dead. silent is how long the member had not
// answered (0: unknown).
func gossipLost(name string, state memberlist.NodeStateType, host string, silent time.Duration) (job.NodeLost, bool) {
	if gossip.IsCoordinator(name) || state == memberlist.StateLeft {
		return job.NodeLost{}, false
	}
	reason := "gossip: no answer from " + host
	if silent > 0 {
		reason += " for " + silent.Round(100*time.Millisecond).String()
	}
	return job.NodeLost{NodeID: name, Reason: reason + " (declared dead by the other nodes)"}, true
}

// DefaultGossipPort is the coordinator's gossip port when none is given:
// the port of listen (HOST:PORT) plus one, or 0 (any free port) when listen
// takes any free port.
func DefaultGossipPort(listen string) int {
	_, p, err := net.SplitHostPort(listen)
	if err != nil {
		return 0
	}
	n, err := strconv.Atoi(p)
	if err != nil || n <= 0 || n >= 65535 {
		return 0
	}
	return n + 1
}

// GossipBind is where a coordinator listening on lis gossips: its host, or
// all interfaces advertised as advertise when it listens on all interfaces.
func GossipBind(lis *net.TCPAddr, port int, advertise string) GossipConfig {
	if lis.IP.IsUnspecified() {
		return GossipConfig{BindAddr: "0.0.0.0", Port: port, AdvertiseAddr: advertise}
	}
	return GossipConfig{BindAddr: lis.IP.String(), Port: port}
}
