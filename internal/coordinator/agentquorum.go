package coordinator

import (
	"github.com/gotrain/gotrain/internal/coordinator/state"
	"slices"
	"strings"
	"time"
)

// Leadership follows the agents. Raft elects a leader that the replicas
// reach; the agents may not: a leader cut off from the agents only (a
// firewall on its gRPC port, a route lost between the agents' network and
// its host) keeps leading, the followers keep naming it, and the agents
// bounce between replicas until they cut themselves off. So the leader
// also counts the agents' heartbeats (ReportProgress, one a second from
// every agent): when a majority of the nodes that heartbeat has not been
// heard here for agentQuorumTimeout, it hands the lead to another
// replica (Raft's leadership transfer, to its most up-to-date follower),
// which the agents' connections find among the replicas they try. A new
// leader waits as long before it judges, and one that hands over waits
// again before it tries anew, so the lead does not flap while agents
// move.

// agentQuorumTimeout is how long a majority of the nodes may go unheard
// before the leader hands over: a few of the agents' heartbeats (1 s),
// well under the node timeout (10 s) that would lose them.
const agentQuorumTimeout = 3 * time.Second

// agentQuorum is the leader's record of the agents it hears. Guarded by
// Server.mu.
type agentQuorum struct {
	since        time.Time            // this leadership began, or the last hand-over was tried
	heard        map[string]time.Time // each node's last heartbeat here
	transferring bool                 // a hand-over is under way
}

// led starts the count at a new leadership. s.mu is held.
func (q *agentQuorum) led(now time.Time) {
	q.since, q.heard, q.transferring = now, map[string]time.Time{}, false
}

// heartbeat notes that node id reached this replica while it leads.
func (q *agentQuorum) heartbeat(id string, now time.Time) {
	if q.heard != nil {
		q.heard[id] = now
	}
}

// unheard are the job's nodes that heartbeat (in the log, or here: a
// node whose heartbeats are in the log but that never reaches a new leader
// counts too, so that a lead that comes back to a replica the agents do
// not reach, an election under load, is handed over again) but
// have not been heard here since agentQuorumTimeout before now (a node
// never heard here counts from when this leadership began), in join
// order; nodes is how many of the job's heartbeat (agents of a version
// without heartbeats, or not yet started, count for nothing).
func (q *agentQuorum) unheard(st *state.State, now time.Time) (silent []string, nodes int) {
	for _, id := range st.Nodes() {
		h, ok := q.heard[id]
		if !ok && st.Beating(id) {
			h, ok = q.since, true
		}
		if !ok || !st.Machine().HasNode(id) {
			continue
		}
		nodes++
		if now.Sub(h) > agentQuorumTimeout {
			silent = append(silent, id)
		}
	}
	slices.SortFunc(silent, state.NodeOrder)
	return silent, nodes
}

// due says whether the leader should hand the lead over now: a majority
// of the nodes that heartbeat has gone unheard (silent, of nodes), and no
// hand-over is under way nor was tried (nor the lead taken) within
// agentQuorumTimeout.
func (q *agentQuorum) due(st *state.State, now time.Time) (silent []string, nodes int, ok bool) {
	if q.transferring || now.Sub(q.since) <= agentQuorumTimeout {
		return nil, 0, false
	}
	silent, nodes = q.unheard(st, now)
	return silent, nodes, nodes > 0 && 2*len(silent) > nodes
}

// checkAgentQuorum hands the lead over when a majority of the nodes has
// gone unheard (each tick, on the leader). s.mu is held.
func (s *Server) checkAgentQuorum() {
	if s.repl == nil || !s.rs.leading || !s.st.Configured() || s.st.Machine().Finished() || len(s.st.Peers()) < 2 {
		return
	}
	silent, nodes, ok := s.aq.due(s.st, s.now())
	if !ok {
		return
	}
	s.aq.transferring = true
	s.log.Warn("the agents do not reach this coordinator replica: handing the lead to another replica",
		"replica", s.repl.ID(), "unheard", strings.Join(silent, ","), "nodes", nodes, "for", agentQuorumTimeout)
	s.bg.do(func() {
		err := s.repl.TransferLeadership()
		s.mu.Lock()
		defer s.mu.Unlock()
		if err != nil {
			s.log.Warn("hand the lead to another replica", "err", err)
		}
		// Leading still (the hand-over failed, or no follower could
		// take it): judge again after as long.
		s.aq.since, s.aq.transferring = s.now(), false
	})
}
