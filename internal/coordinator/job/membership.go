package job

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Membership: who runs the job, and what a node's coming and going does.
//
// A job runs on between MinNodes and Nodes nodes (--nnodes MIN:MAX; N is
// N:N). The first generation starts as soon as Nodes have joined, or
// JoinSettle after the last join once at least MinNodes have. A node that
// joins a running job with fewer than Nodes is admitted at a new
// generation, JoinSettle after the last such join, so that a burst of
// joins is one generation change (a growth, not a failure: it does not
// count against MaxRestarts). A lost node ends the generation like a
// failure; the next runs on the survivors while MinNodes remain.
//
// A node is lost when its agent says so (NodeLost: its stream ended for
// good), or when it has been unreachable (NodeUnreachable: its watch stream
// broke, gossip finds it silent) for NodeTimeout without becoming reachable
// again (NodeReachable: it reconnected, gossip hears it). A blip shorter
// than NodeTimeout changes nothing: training goes on. The default of 10 s
// is longer than the blips seen on loaded clusters (a 1–2 s drop ended jobs
// before), shorter than a person's patience, and within what a stalled TCP
// connection of the data plane survives without error; the agent of a node
// cut off for longer stops its own workers after the same time.
//
// Attaching (Config.Attach): a node counts for the job — for starting it,
// its size, the nodes a generation runs on — only once its agent attached
// (its first NodeReachable: its watch stream opened), not at its join.
// One that has not attached NodeTimeout after joining is dropped, named:
// whoever holds the job token could join and never watch, and such a
// node made a fixed-size job start on it and wait for ranks that never ran
// while the real node was refused. Pending nodes are bounded (Nodes of
// them at once).
//
// Blame: when one node stays reachable while every other node (two or more)
// becomes unreachable at once, it is that node, not the others, that is cut
// off: with the coordinator embedded in it, the coordinator only sees its
// own node. The job then fails naming that node.

// Defaults of Config.
const (
	DefaultNodeTimeout = 10 * time.Second
	DefaultJoinSettle  = 3 * time.Second
)

// NodeUnreachable: the coordinator lost contact with a node (its watch
// stream broke, gossip cannot reach it). It is lost if it stays so for
// NodeTimeout. Repeated events keep the first time.
type NodeUnreachable struct {
	NodeID string
	Reason string
}

// NodeReachable: a node is in contact again (its watch stream is back,
// gossip hears it).
type NodeReachable struct {
	NodeID string
}

func (NodeUnreachable) isEvent() {}
func (NodeReachable) isEvent()   {}

// membership is what the machine remembers of joins to act on.
type membership struct {
	// actAt is when to act on the joins so far (start the first
	// generation, or grow); zero: nothing to do.
	actAt time.Time
	// growing: the running generation was ended to admit new nodes.
	growing bool
	// endedAt is when the latest generation ended.
	endedAt time.Time
}

// blameWindow: a node lost this soon after a generation ended for a
// worker's failure is taken as that failure's cause (blameLost).
const blameWindow = 2 * time.Second

// blameLost makes node n, lost with its running ranks while the generation
// ends, the root cause instead of a worker's exit seen just before: when a
// node dies, its peers' collectives fail at once, and one of them may
// report its exit before the coordinator learns the node is gone — the
// report must name the node that died, not the healthy one that noticed.
// A signal or an OOM kill is a cause of its own and stays.
func (m *Machine) blameLost(n *node, lostRanks []int, reason string) {
	f := m.failure
	if len(lostRanks) == 0 || f == nil || f.Reason != "" || f.Signal != "" || f.OOMKilled || m.now.Sub(m.members.endedAt) > blameWindow {
		return
	}
	if reason == "" {
		reason = "node lost"
	}
	m.failure = &Failure{Rank: lostRanks[0], NodeID: n.id, Hostname: n.info.Hostname, Pid: n.info.AgentPID, Reason: reason,
		Notes: []string{fmt.Sprintf("rank %d on %s exited with code %d just before, most likely because of this node: its peers' collectives fail when a node dies", f.Rank, f.Hostname, f.ExitCode)}}
	m.reason = fmt.Sprintf("node %s on %s (%s, agent pid %d; %s) was lost: %s", n.id, n.info.Hostname, n.info.Address, n.info.AgentPID, rankList(lostRanks), reason)
}

// nnodes is --nnodes as the user wrote it.
func (m *Machine) nnodes() string {
	if m.cfg.MinNodes == m.cfg.Nodes {
		return strconv.Itoa(m.cfg.Nodes)
	}
	return fmt.Sprintf("%d:%d", m.cfg.MinNodes, m.cfg.Nodes)
}

// joined acts on node id's join.
func (m *Machine) joined(id string) []Action {
	switch {
	case m.state == StateWaiting && m.placed() >= m.cfg.Nodes:
		return []Action{m.start(0, 0)}
	case m.state == StateWaiting && m.placed() >= m.cfg.MinNodes,
		m.state == StateRunning:
		// Wait for more joins first.
		m.members.actAt = m.now.Add(m.cfg.JoinSettle)
	}
	// Restarting: the next generation includes it.
	return nil
}

// unreachable records that a node is out of contact.
func (m *Machine) unreachable(ev NodeUnreachable) ([]Action, error) {
	n := m.nodes[ev.NodeID]
	if n == nil {
		return nil, fmt.Errorf("%w %q unreachable", ErrUnknownNode, ev.NodeID)
	}
	if n.unreachableSince.IsZero() {
		n.unreachableSince, n.unreachableWhy = m.now, ev.Reason
	}
	return nil, nil
}

// reachable records that a node is in contact again, or, the first time
// (Config.Attach), that it attached: it counts for the job from now on.
func (m *Machine) reachable(ev NodeReachable) ([]Action, error) {
	n := m.nodes[ev.NodeID]
	if n == nil {
		return nil, fmt.Errorf("%w %q reachable", ErrUnknownNode, ev.NodeID)
	}
	n.unreachableSince, n.unreachableWhy = time.Time{}, ""
	if n.attached {
		return nil, nil
	}
	if m.state != StateWaiting && m.placed() >= m.cfg.Nodes {
		// Another node took its place meanwhile.
		delete(m.nodes, n.id)
		return []Action{DropNode{NodeID: n.id, Hostname: n.info.Hostname, Reason: fmt.Sprintf(
			"node %s on %s attached after the job had started on its maximum of %s (--nnodes %s): it has no place; start it again to wait for one",
			n.id, n.info.Hostname, plural(m.cfg.Nodes, "node"), m.nnodes())}}, nil
	}
	n.attached = true
	return m.joined(n.id), nil
}

// attachTimeouts drops the nodes that joined NodeTimeout ago or more and
// never attached (Config.Attach): a process that holds the job token and
// joins but never watches is no working agent, and it must neither hold
// a place the job waits on nor keep the real node out. nil when none is.
func (m *Machine) attachTimeouts() []Action {
	var out []Action
	for _, n := range m.orderedNodes() {
		if n.attached || m.now.Before(n.joinedAt.Add(m.cfg.NodeTimeout)) {
			continue
		}
		delete(m.nodes, n.id)
		out = append(out, DropNode{NodeID: n.id, Hostname: n.info.Hostname, Reason: fmt.Sprintf(
			"node %s on %s (%s, agent pid %d) joined %s ago and never opened its watch stream: dropped, the job goes on without it; "+
				"if it is a node of yours, its agent is stuck or cannot reach the coordinator's port again (start it again), otherwise a process that holds the job token joined: change the token",
			n.id, n.info.Hostname, n.info.Address, n.info.AgentPID, m.now.Sub(n.joinedAt).Round(100*time.Millisecond))})
	}
	return out
}

// membershipTick loses nodes unreachable for NodeTimeout, and acts on joins
// that have settled. nil when there is nothing to do.
func (m *Machine) membershipTick() []Action {
	if m.Finished() {
		return nil
	}
	if acts := m.attachTimeouts(); acts != nil {
		return acts
	}
	if acts := m.timeouts(); acts != nil {
		return acts
	}
	if m.members.actAt.IsZero() || m.now.Before(m.members.actAt) {
		return nil
	}
	m.members.actAt = time.Time{}
	switch {
	case m.state == StateWaiting && m.placed() >= m.cfg.MinNodes:
		return []Action{m.start(0, 0)}
	case m.state == StateRunning:
		var joined []string
		for _, n := range m.placedNodes() {
			if n.groupRank < 0 {
				joined = append(joined, fmt.Sprintf("%s on %s", n.id, n.info.Hostname))
			}
		}
		if len(joined) == 0 {
			return nil
		}
		m.members.growing = true
		desc := fmt.Sprintf("%s joined: the job grows to %s", strings.Join(joined, ", "), plural(m.placed(), "node"))
		return append(m.end(nil, desc), m.afterEnd()...)
	}
	return nil
}

// timeouts loses the nodes unreachable for NodeTimeout; nil when none is.
func (m *Machine) timeouts() []Action {
	var late []*node
	for _, n := range m.placedNodes() {
		if !n.unreachableSince.IsZero() && !m.now.Before(n.unreachableSince.Add(m.cfg.NodeTimeout)) {
			late = append(late, n)
		}
	}
	if len(late) == 0 {
		return nil
	}
	if cut := m.cutOff(); cut != nil {
		return m.failCutOff(cut)
	}
	var out []Action
	for _, n := range late {
		reason := fmt.Sprintf("unreachable for %s (%s)", m.now.Sub(n.unreachableSince).Round(100*time.Millisecond), n.unreachableWhy)
		acts, err := m.lost(NodeLost{NodeID: n.id, Reason: reason})
		if err == nil {
			out = append(out, acts...)
		}
		if m.Finished() {
			break
		}
	}
	return out
}

// cutOff returns the one node still reachable when all the others, two or
// more, are unreachable: the node that is cut off from them.
func (m *Machine) cutOff() *node {
	placed := m.placedNodes()
	if len(placed) < 3 {
		return nil
	}
	var reachable *node
	for _, n := range placed {
		if n.unreachableSince.IsZero() {
			if reachable != nil {
				return nil
			}
			reachable = n
		}
	}
	return reachable
}

// failCutOff ends the job blaming node cut, which lost contact with every
// other node: restarting on it alone would only repeat that.
func (m *Machine) failCutOff(cut *node) []Action {
	var others []string
	for _, n := range m.placedNodes() {
		if n != cut {
			others = append(others, n.info.Hostname)
		}
	}
	reason := fmt.Sprintf("cut off from every other node (%s) for %s: its network, not theirs, failed (the coordinator runs there or reaches only it)",
		strings.Join(others, ", "), m.cfg.NodeTimeout)
	f := &Failure{Rank: -1, NodeID: cut.id, Hostname: cut.info.Hostname, Pid: cut.info.AgentPID, Reason: reason}
	if m.state == StateRunning {
		for r := range m.ranks {
			if m.ranks[r].nodeID == cut.id {
				f.Rank = r
				break
			}
		}
	}
	m.failure, m.state = f, StateFailed
	desc := fmt.Sprintf("node %s on %s (%s) was %s", cut.id, cut.info.Hostname, cut.info.Address, reason)
	acts := m.failBarriers("the job failed: " + desc)
	return append(acts, FinishJob{ExitCode: 1, Failure: copyFailure(f), Message: "job failed: " + desc})
}

// Attached says whether node id's agent attached (Config.Attach; every node
// of the job without it): a new stream of a node that has not is its
// attach, which the caller reports as NodeReachable.
func (m *Machine) Attached(id string) bool {
	n := m.nodes[id]
	return n != nil && n.attached
}

// Unreachable says whether node id is out of contact now (NodeUnreachable
// and no NodeReachable since): a new leader of a replicated coordinator
// starts from it.
func (m *Machine) Unreachable(id string) bool {
	n := m.nodes[id]
	return n != nil && !n.unreachableSince.IsZero()
}

// NodeHostname is node id's hostname as it joined ("" for an unknown node).
func (m *Machine) NodeHostname(id string) string {
	if n := m.nodes[id]; n != nil {
		return n.info.Hostname
	}
	return ""
}

// NodeAddress is node id's address as it joined ("" for an unknown node).
func (m *Machine) NodeAddress(id string) string {
	if n := m.nodes[id]; n != nil {
		return n.info.Address
	}
	return ""
}
