package snaptier

import (
	"fmt"
	"slices"

	"github.com/gotrain/gotrain/internal/memsnap"
	gotrainv1 "github.com/gotrain/gotrain/proto/gotrain/v1"
)

// Who may call the peer port. The port's TLS admits any certificate the
// job CA ever issued, and node certificates outlive a node's membership
// (a node that once took a free place in an elastic job and left keeps a
// valid one). So every call is also checked against the generation this
// agent runs, which it learns from the replicated state through its
// coordinator: only a node of that generation gets in, a replica only for
// a rank that node runs, and a fetch (Have, Fetch) only for a rank that
// node runs now, the ranks it is taking over. This is the pure decision;
// Peers waits for the generation a caller is in and marks its connection
// authenticated once a call passed (peers.go).

// Member is one node of a generation: its id, group rank and ranks.
type Member struct {
	Node      string
	GroupRank int
	Ranks     []int
}

// Generation is what the agent learns of each generation it runs: its
// number, this node's group rank, every node of it, and the job's snapshot
// key (nil without a job CA).
type Generation struct {
	Gen       int64
	GroupRank int
	Members   []Member
	Key       []byte
}

// GenerationOf is the generation a GenerationStarted event tells.
func GenerationOf(g *gotrainv1.GenerationStarted) Generation {
	out := Generation{Gen: g.GetGeneration(), GroupRank: int(g.GetGroupRank()), Key: g.GetSnapshotKey()}
	for _, n := range g.GetNodes() {
		m := Member{Node: n.GetNodeId(), GroupRank: int(n.GetGroupRank())}
		for _, r := range n.GetRanks() {
			m.Ranks = append(m.Ranks, int(r))
		}
		out.Members = append(out.Members, m)
	}
	return out
}

// member is node's entry of g; false when node is not one of its nodes.
func (g Generation) member(node string) (Member, bool) {
	for _, m := range g.Members {
		if m.Node == node {
			return m, true
		}
	}
	return Member{}, false
}

// byGroupRank is the node of group rank gr in g; "" when none.
func (g Generation) byGroupRank(gr int) string {
	for _, m := range g.Members {
		if m.GroupRank == gr {
			return m.Node
		}
	}
	return ""
}

// mayCall says whether node may send (replicate) or ask for (fetch) rank's
// replica while this agent runs g; the error wraps memsnap.ErrPeerRefused
// and says who and why. started is false before the agent's first
// generation: nobody is a member yet.
func mayCall(g Generation, started bool, node, call string, rank int) error {
	switch {
	case node == "":
		return fmt.Errorf("%w: %s of rank %d: the connection presented no node certificate", memsnap.ErrPeerRefused, call, rank)
	case !started:
		return fmt.Errorf("%w: %s of rank %d by node %q: this agent runs no generation yet", memsnap.ErrPeerRefused, call, rank, node)
	}
	m, ok := g.member(node)
	if !ok {
		return fmt.Errorf("%w: %s of rank %d by node %q: it is not a node of generation %d (it left the job, or never was in it); its certificate admits it to the snapshot tier no more",
			memsnap.ErrPeerRefused, call, rank, node, g.Gen)
	}
	if !slices.Contains(m.Ranks, rank) {
		what := "a node replicates only its own ranks"
		if call != "replicate" {
			what = "a node fetches only the ranks it runs now (those it takes over)"
		}
		return fmt.Errorf("%w: %s of rank %d by node %q: rank %d does not run on it in generation %d (it runs %v): %s",
			memsnap.ErrPeerRefused, call, rank, node, rank, g.Gen, m.Ranks, what)
	}
	return nil
}
