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

// Records travel as int32 words: Words and Bytes are inverses, little-endian.
func TestWordsBytes(t *testing.T) {
	b := []byte{1, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0x78, 0x56, 0x34, 0x12}
	w := Words(b)
	if len(w) != 3 || w[0] != 1 || w[1] != -1 || w[2] != 0x12345678 {
		t.Fatalf("Words = %v", w)
	}
	if got := Bytes(w); string(got) != string(b) {
		t.Fatalf("Bytes(Words(b)) = %v, want %v", got, b)
	}
}
