package job

import (
	"cmp"
	"fmt"
	"slices"
)

// Admission order: which node is group rank 0 (MASTER_ADDR, MASTER_PORT,
// the rank that publishes each communicator's NCCL id) and how the others
// follow. No name a node chooses decides it: a token holder that joined
// as "aaa" used to become group rank 0, report its ranks done and leave,
// and the job's real ranks waited in their rendezvous until killed.
//
//  1. The host: the node whose agent runs the coordinator
//     (NodeJoined.Host; the caller checks a secret only that agent holds).
//  2. Nodes that give their scheduler's node rank (NodeJoined.NodeRank:
//     Slurm's SLURM_NODEID, torchrun's --node-rank), by that rank. Equal
//     ranks (a rank given twice) go by join order.
//  3. The rest, in the order they joined.
//
// The order is stable: a node keeps its place relative to the others
// across generations, and a node that joins a running job comes after
// those of its kind already there.

// orderedNodes returns the present nodes in admission order.
func (m *Machine) orderedNodes() []*node {
	out := make([]*node, 0, len(m.nodes))
	for _, n := range m.nodes {
		out = append(out, n)
	}
	slices.SortFunc(out, func(a, b *node) int {
		return cmp.Or(
			compareBool(b.host, a.host), // the host first
			compareBool(a.nodeRank < 0, b.nodeRank < 0),
			cmp.Compare(a.nodeRank, b.nodeRank),
			cmp.Compare(a.seq, b.seq))
	})
	return out
}

// placedNodes are the nodes that count for the job (attached: Config.Attach),
// in orderedNodes' order: those a generation runs on.
func (m *Machine) placedNodes() []*node {
	return slices.DeleteFunc(m.orderedNodes(), func(n *node) bool { return !n.attached })
}

// placed is how many nodes count for the job (placedNodes).
func (m *Machine) placed() int {
	k := 0
	for _, n := range m.nodes {
		if n.attached {
			k++
		}
	}
	return k
}

// compareBool orders false before true.
func compareBool(a, b bool) int {
	switch {
	case a == b:
		return 0
	case !a:
		return -1
	}
	return 1
}

// checkHost refuses a second host: one agent runs the coordinator.
func (m *Machine) checkHost(ev NodeJoined) error {
	if !ev.Host {
		return nil
	}
	for _, n := range m.nodes {
		if n.host {
			return fmt.Errorf("%w: node %q on %s says it runs the coordinator, but node %q on %s does", ErrDuplicateNode, ev.NodeID, ev.Info.Hostname, n.id, n.info.Hostname)
		}
	}
	return nil
}

// Leaving before the first step: a node whose ranks all exited with code 0
// and that is then lost, while ranks of other nodes still run and none of
// those has completed a step or a collective in this generation, ends the
// generation as a failure naming it. Its ranks did not take part in the
// job: the others wait for them (in their rendezvous at its MASTER_ADDR,
// or in their first collective) and would wait until killed. This is a
// squatter's way out (it reports exit 0 for ranks it never ran), or a
// program that exits at once on one node.
//
// The evidence that the job began is the others' progress only: a node
// that leaves cannot vouch for itself. Not a failure, then:
//   - ranks that finish at different times and nodes that stay until the
//     job ends (agents do: they wait for the job's verdict): a node's loss
//     is the trigger;
//   - programs without collectives (`true`) whose ranks all exit 0: the
//     job succeeds with the last exit, before anything is lost;
//   - a node lost after the others reported a step or a completed
//     collective: the job had begun, its ranks' work was done.
//
// A node lost this way in a job whose other ranks do not report progress
// (programs that do not attach to gotrain and where NCCL's RAS is not
// reachable) fails the job too: gotrain cannot tell that its work was
// done, and waiting is what left ranks hanging.

// leftEarly returns the failure for node n, lost while the generation runs
// with none of its ranks running, when n left before the first step (see
// above); nil otherwise.
func (m *Machine) leftEarly(n *node) (*Failure, string) {
	var mine, waiting []int
	for r := range m.ranks {
		rk := &m.ranks[r]
		switch {
		case rk.nodeID == n.id:
			if rk.state != RankExited {
				return nil, ""
			}
			mine = append(mine, r)
		case rk.state == RankRunning:
			waiting = append(waiting, r)
		}
	}
	if len(mine) == 0 || len(waiting) == 0 || m.othersBegan(n.id) {
		return nil, ""
	}
	reason := fmt.Sprintf("left before the job's first step: its ranks reported exit code 0 while the other nodes' ranks (%s) still wait for them, "+
		"and none of those has completed a step or a collective in generation %d; check what ran on %s (a program that ends at once) "+
		"and who joined the job (a node that is not the job's)", rankList(waiting), m.gen, n.info.Hostname)
	f := &Failure{Rank: mine[0], NodeID: n.id, Hostname: n.info.Hostname, Pid: n.info.AgentPID, Reason: reason}
	desc := fmt.Sprintf("node %s on %s (%s, agent pid %d; %s) %s", n.id, n.info.Hostname, n.info.Address, n.info.AgentPID, rankList(mine), reason)
	return f, desc
}

// othersBegan says whether a rank on another node than id reported a step
// or a completed collective in the current generation.
func (m *Machine) othersBegan(id string) bool {
	for _, r := range m.ranks {
		if r.nodeID == id || r.progress == nil {
			continue
		}
		if r.progress.Step > 0 || slices.ContainsFunc(r.progress.Comms, func(c CommProgress) bool { return c.CompletedSeq > 0 }) {
			return true
		}
	}
	return false
}
