package peermem

import (
	"errors"
	"fmt"
	"testing"
)

func TestNodeIDStable(t *testing.T) {
	if a, b := NodeID(), NodeID(); a != b || a == 0 {
		t.Fatalf("NodeID %x then %x, want one non-zero id", a, b)
	}
}

// The error names the transport, the rank and the reason, and errors.As
// finds it through a wrap (DataParallel falls back to NCCL on it).
func TestUnavailableError(t *testing.T) {
	err := fmt.Errorf("open: %w", &UnavailableError{Transport: "nodereduce", Rank: 3, Reason: "rank 1 is on another node"})
	var un *UnavailableError
	if !errors.As(err, &un) || un.Rank != 3 {
		t.Fatalf("errors.As(%v) = %v, %+v", err, errors.As(err, &un), un)
	}
	if want := "open: nodereduce: rank 3: the copy-engine reduction is not available: rank 1 is on another node"; err.Error() != want {
		t.Errorf("Error() = %q, want %q", err.Error(), want)
	}
}
