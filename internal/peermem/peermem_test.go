package peermem

import "testing"

func TestNodeIDStable(t *testing.T) {
	if a, b := NodeID(), NodeID(); a != b || a == 0 {
		t.Fatalf("NodeID %x then %x, want one non-zero id", a, b)
	}
}
