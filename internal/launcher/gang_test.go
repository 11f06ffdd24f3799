package launcher

import (
	"testing"

	gotrainv1 "github.com/gotrain/gotrain/proto/gotrain/v1"
)

// TestGangDue: the gang check runs before a node's first generation and
// before a generation with a node new to it (an elastic job grown, a
// replacement), not before a restart of the same nodes nor a shrink.
func TestGangDue(t *testing.T) {
	gen := func(ids ...string) *gotrainv1.GenerationStarted {
		g := &gotrainv1.GenerationStarted{}
		for i, id := range ids {
			g.Nodes = append(g.Nodes, &gotrainv1.GenerationNode{NodeId: id, GroupRank: int32(i)})
		}
		return g
	}
	a := &agent{}
	for i, step := range []struct {
		g   *gotrainv1.GenerationStarted
		due bool
	}{
		{gen("node-1", "node-2", "node-3"), true},  // the first
		{gen("node-1", "node-2", "node-3"), false}, // a restart
		{gen("node-1", "node-2"), false},           // node-3 left
		{gen("node-1", "node-2", "node-4"), true},  // node-4 joined
		{gen("node-1", "node-2", "node-4"), false},
	} {
		if got := a.gangDue(step.g); got != step.due {
			t.Errorf("step %d: due %v, want %v", i, got, step.due)
		}
	}
	a.gangExit = &ExitError{Code: 4}
	if a.gangDue(gen("node-9")) {
		t.Errorf("due after the node's gang check kept it out")
	}
}
