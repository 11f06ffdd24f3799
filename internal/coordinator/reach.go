package coordinator

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"syscall"
	"time"

	"github.com/gotrain/gotrain/internal/coordinator/job"
)

// Reachability: what the server tells the machine about a node's contact
// (internal/coordinator/job's membership.go decides what it means). A node that
// joined is out of contact until its first watch stream opens, which the
// machine hears as its attach (NodeReachable). A node is
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
	ev := o.recheck(id, why, s.gossip != nil, s.st.Machine().Attached(id), s.st.Machine().Config(), s.log)
	if ev == nil {
		return
	}
	if err := s.step(ev); err != nil {
		s.log.Error("node reachability", "node_id", id, "event", fmt.Sprintf("%T", ev), "err", err)
	}
}

// recheck re-evaluates node id's contact and returns what the machine must
// hear: NodeReachable, NodeUnreachable, or nil for nothing. gossips: the
// job gossips; attached: the machine counts the node as attached (else its
// first stream is its attach); jc: the job's configuration (for the log
// lines).
func (o *outbox) recheck(id, why string, gossips, attached bool, jc job.Config, log *slog.Logger) job.Event {
	reachable := o.attached && !o.gossipDown
	switch {
	case reachable && o.unreachable:
		o.unreachable, o.blamed = false, false
		if attached {
			log.Info("node reachable again", "node_id", id)
		} else {
			log.Info("node attached", "node_id", id)
		}
		return job.NodeReachable{NodeID: id}
	case !reachable && !o.unreachable:
		o.unreachable = true
		o.blame(id, why, gossips, jc, log)
		return job.NodeUnreachable{NodeID: id, Reason: why}
	case !reachable && o.gossipDown && !o.blamed:
		o.blame(id, why, gossips, jc, log) // its peers agree now
	}
	return nil
}

// blame logs that node id is out of contact. A node is named as
// unreachable (a warning) only once its peers agree: gossip finds it dead
// too, or the job does not gossip. Until then only this coordinator lost
// its stream — a blip on the way, or this replica cut off — and the line
// says so, as information.
func (o *outbox) blame(id, why string, gossips bool, jc job.Config, log *slog.Logger) {
	if o.gossipDown || !gossips {
		o.blamed = true
		level := slog.LevelWarn
		if jc.Nodes == 1 {
			// The one node's agent is the one that stops (Ctrl-C), and its
			// coordinator is most often its own: nothing to warn of.
			level = slog.LevelInfo
		}
		log.Log(context.Background(), level, "node unreachable", "node_id", id, "reason", why, "lost_after", jc.NodeTimeout)
		return
	}
	log.Info("node out of contact with this coordinator; its peers still hear it", "node_id", id, "reason", why, "lost_after", jc.NodeTimeout)
}

// reports: the node reported (progress, or an empty report: the agents'
// heartbeat). An agent that reports is alive: gossip's verdict of dead is
// false (memberlist on an overloaded machine misses its probes), so it no
// longer counts while the node's stream is attached. It says whether that
// changed the node's contact.
func (o *outbox) reports() bool {
	if !o.gossipDown || !o.attached {
		return false
	}
	o.gossipDown = false
	return true
}

// gossipSays: gossip finds node id dead (it is unreachable until gossip
// hears it again, reason saying why), or hears it (again).
func (s *Server) gossipSays(id string, dead bool, reason string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	o := s.streams.of(s.st, id)
	switch {
	case o == nil:
		return
	case dead && (s.st.Machine().Finished() || s.stop.Err() != nil):
		return
	case !dead && !o.gossipDown:
		return
	}
	o.gossipDown = dead
	s.reachability(id, o, reason)
}

// probe checks, after node id's stream ended, whether its agent's process
// is gone, and loses the node at once when it is. It runs in the
// background (s.bg), which Serve ends. Whichever finds the node lost first
// wins: a node already lost (or unknown) is left alone, and its stream,
// once it ends, is ignored (streamEnded); a stream still open is ended, so
// that an agent that comes back stops its workers.
func (s *Server) probe(id, reason string) {
	s.mu.Lock()
	addr := s.gossip.addr(id)
	s.mu.Unlock()
	if addr == "" {
		return // no gossip: the node timeout decides
	}
	away := func() bool { // still in the job without a stream
		s.mu.Lock()
		defer s.mu.Unlock()
		o := s.streams.of(s.st, id)
		return o != nil && !o.attached
	}
	if !agentGone(s.stop, addr, away) {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.st.Outbox(id) == nil || s.st.Machine().Finished() || s.stop.Err() != nil {
		return
	}
	ev := job.NodeLost{NodeID: id, Reason: fmt.Sprintf("%s; its agent is gone (nothing listens at its gossip port %s)", reason, addr)}
	if err := s.step(ev); err != nil {
		s.log.Error("node lost", "node_id", id, "err", err)
	}
}

// agentGone probes an agent's gossip port addr for probeFor, while away
// holds, and says whether its connection is refused: the host answers,
// nothing listens.
func agentGone(ctx context.Context, addr string, away func() bool) bool {
	for deadline := time.Now().Add(probeFor); ; {
		conn, err := net.DialTimeout("tcp", addr, probeTimeout)
		if err == nil {
			_ = conn.Close()
		} else if errors.Is(err, syscall.ECONNREFUSED) {
			return true
		}
		if time.Now().After(deadline) || !away() {
			return false
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(probeEvery):
		}
	}
}
