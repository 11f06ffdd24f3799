package relay

import (
	"errors"
	"testing"

	"github.com/gotrain/gotrain/internal/coordinator"
)

// A worker's calls are refused past its own budget, all workers' past the
// node's; a call that ends gives its place back, to its worker and to the
// node.
func TestBudget(t *testing.T) {
	b := newBudget(2, 3)
	for _, key := range []int{10, 10, 20} {
		if err := b.take(key); err != nil {
			t.Fatalf("take(%d): %v", key, err)
		}
	}
	var over errOverBudget
	if err := b.take(10); !errors.As(err, &over) || !over.worker || over.limit != 2 {
		t.Errorf("a third call of worker 10: %v, want its own budget of 2", err)
	}
	if err := b.take(30); !errors.As(err, &over) || over.worker || over.limit != 3 {
		t.Errorf("a fourth call on the node: %v, want the node's budget of 3", err)
	}
	b.give(10)
	if err := b.take(30); err != nil {
		t.Errorf("after a call ended, another worker's: %v", err)
	}
	if err := b.take(10); err == nil {
		t.Error("the node is full again, yet worker 10 got a call")
	}
	b.give(20)
	if err := b.take(10); err != nil {
		t.Errorf("after worker 20's call ended, worker 10's: %v", err)
	}
	if len(b.calls) != 2 || b.all != 3 {
		t.Errorf("calls %v, all %d: want workers 10 and 30, 3 in all", b.calls, b.all)
	}
}

// The workers' calls together leave some of the streams the coordinator
// admits on the agent's connection to the agent itself.
func TestBudgetLeavesTheAgentStreams(t *testing.T) {
	const coordinatorStreams = 2*coordinator.MaxNprocPerNode + 64 // internal/coordinator/limits.go
	if relayedCalls > coordinatorStreams-32 {
		t.Errorf("the workers may hold %d of the %d streams the coordinator admits a connection: the agent's own calls need room", relayedCalls, coordinatorStreams)
	}
	if perWorkerCalls*2 > relayedCalls {
		t.Errorf("one worker's budget (%d) is over half the node's (%d)", perWorkerCalls, relayedCalls)
	}
}
