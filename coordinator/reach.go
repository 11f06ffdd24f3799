package coordinator

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"syscall"
	"time"

	"github.com/gotrain/gotrain/coordinator/job"
)

// Reachability: what the server tells the machine about a node's contact
// (coordinator/job's membership.go decides what it means). A node is
// reachable while its watch stream is attached and gossip (when the job
// gossips) does not find it dead; the machine hears NodeUnreachable when it
// stops being so and NodeReachable when it is again, and loses it only
// after its node timeout. A blip that breaks the stream or silences gossip
// for less changes nothing: the agent opens a new stream.
//
// A stream that ends because the agent's process is gone would otherwise
// cost the whole node timeout: the server probes the agent's gossip port
// (TCP), and a refused connection — the host answers, nothing listens —
// loses the node at once. A frozen or cut-off agent does not refuse (its
// kernel still accepts, or nothing answers), and waits out the timeout.

// probeTimeout bounds the dial of a probe; probeFor is how long the probe
// tries: a process being SIGKILLed can close its connections a moment
// before its listening socket, and a loaded machine stretches that moment.
const (
	probeTimeout = time.Second
	probeFor     = 3 * time.Second
	probeEvery   = 200 * time.Millisecond
)

// reachability re-evaluates node id's contact after a change of its stream
// or gossip state, and tells the machine. s.mu is held.
func (s *Server) reachability(id string, o *outbox, why string) {
	reachable := o.attached && !o.gossipDown
	switch {
	case reachable && o.unreachable:
		o.unreachable, o.blamed = false, false
		s.log.Info("node reachable again", "node_id", id)
		if err := s.step(job.NodeReachable{NodeID: id}); err != nil {
			s.log.Error("node reachable", "node_id", id, "err", err)
		}
	case !reachable && !o.unreachable:
		o.unreachable = true
		s.blame(id, o, why)
		if err := s.step(job.NodeUnreachable{NodeID: id, Reason: why}); err != nil {
			s.log.Error("node unreachable", "node_id", id, "err", err)
		}
	case !reachable && o.gossipDown && !o.blamed:
		s.blame(id, o, why) // its peers agree now
	}
}

// blame logs that node id is out of contact. A node is named as
// unreachable (a warning) only once its peers agree: gossip finds it dead
// too, or the job does not gossip. Until then only this coordinator lost
// its stream — a blip on the way, or this replica cut off — and the line
// says so, as information. s.mu is held.
func (s *Server) blame(id string, o *outbox, why string) {
	if o.gossipDown || s.gossip == nil {
		o.blamed = true
		level := slog.LevelWarn
		if s.st.Machine().Config().Nodes == 1 {
			// The one node's agent is the one that stops (Ctrl-C), and its
			// coordinator is most often its own: nothing to warn of.
			level = slog.LevelInfo
		}
		s.log.Log(context.Background(), level, "node unreachable", "node_id", id, "reason", why, "lost_after", s.st.Machine().Config().NodeTimeout)
		return
	}
	s.log.Info("node out of contact with this coordinator; its peers still hear it", "node_id", id, "reason", why, "lost_after", s.st.Machine().Config().NodeTimeout)
}

// gossipDead: gossip finds node ev.NodeID dead. It is unreachable until
// gossip hears it again.
func (s *Server) gossipDead(ev job.NodeLost) {
	s.mu.Lock()
	defer s.mu.Unlock()
	o := s.outbox(ev.NodeID)
	if o == nil || s.st.Machine().Finished() || s.stop.Err() != nil {
		return
	}
	o.gossipDown = true
	s.reachability(ev.NodeID, o, ev.Reason)
}

// gossipAlive: gossip hears node id (again).
func (s *Server) gossipAlive(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	o := s.outbox(id)
	if o == nil || !o.gossipDown {
		return
	}
	o.gossipDown = false
	s.reachability(id, o, "")
}

// probe checks, after node id's stream ended, whether its agent's process
// is gone, and loses the node at once when it is. It runs in the
// background (s.bg), which Serve ends.
func (s *Server) probe(id, reason string) {
	s.mu.Lock()
	addr := s.gossip.addr(id)
	s.mu.Unlock()
	if addr == "" {
		return // no gossip: the node timeout decides
	}
	for deadline := time.Now().Add(probeFor); ; {
		conn, err := net.DialTimeout("tcp", addr, probeTimeout)
		if err == nil {
			_ = conn.Close()
		} else if errors.Is(err, syscall.ECONNREFUSED) {
			s.nodeLost(job.NodeLost{NodeID: id, Reason: fmt.Sprintf("%s; its agent is gone (nothing listens at its gossip port %s)", reason, addr)})
			return
		}
		if time.Now().After(deadline) || !s.stillAway(id) {
			return
		}
		select {
		case <-s.stop.Done():
			return
		case <-time.After(probeEvery):
		}
	}
}

// stillAway says whether node id is still in the job without a stream.
func (s *Server) stillAway(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	o := s.outbox(id)
	return o != nil && !o.attached
}

// heardFrom: node id reported (progress, or an empty report: the agents'
// heartbeat). An agent that reports is alive: gossip's verdict of dead is
// false (memberlist on an overloaded machine misses its probes), so it no
// longer counts while the node's stream is attached. s.mu is held.
func (s *Server) heardFrom(id string) {
	o := s.outbox(id)
	if o == nil || !o.gossipDown || !o.attached {
		return
	}
	o.gossipDown = false
	s.log.Info("gossip found the node dead, but it reports: reachable", "node_id", id)
	s.reachability(id, o, "")
}
