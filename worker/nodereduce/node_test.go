package nodereduce

import (
	"context"
	"errors"
	"testing"

	"github.com/gotrain/gotrain/internal/peermem"
	"github.com/gotrain/gotrain/worker/cpucomm"
	"github.com/gotrain/gotrain/worker/cpucomm/cpucommtest"
)

func TestRecordRoundTrip(t *testing.T) {
	var r record
	for i := range r.inbox {
		r.inbox[i], r.grads[i] = byte(255-i), byte(i*3)
	}
	r.inboxPtr, r.gradsBase, r.gradsOff = 0x7f00_1234_5000, 0x7f00_8000_0000, 4096
	r.node, r.process, r.busID, r.gradsErr = 0xdead_beef_cafe_f00d, 42, "0000:00:07.0", true
	w := r.encode()
	if len(w) != recordBytes/4 {
		t.Fatalf("encoded to %d words, want %d", len(w), recordBytes/4)
	}
	if got := decode(w); got != r {
		t.Fatalf("decode(encode(r)) = %+v, want %+v", got, r)
	}
}

// The chunks of every bucket cover it exactly, in rank order, each
// starting on a 256-byte line of the bucket; the inbox slots of different
// buckets and ranks never overlap and each holds a whole chunk.
func TestLayoutCoversBuckets(t *testing.T) {
	buckets := []Span{{0, 1}, {1, 63}, {64, 1<<20 + 3}, {1<<20 + 67, 777_777}, {3 << 20, 8}}
	for _, ranks := range []int{2, 3, 4, 7, 8} {
		l := newLayout(ranks, buckets)
		used := make([]int, l.inboxLen) // inbox element → slot users
		for b, bk := range buckets {
			next := bk.Offset
			for k := range ranks {
				from, n := l.part(b, bk, k)
				if n < 0 || n > l.chunk[b] {
					t.Fatalf("ranks %d bucket %d rank %d: %d elements, chunk %d", ranks, b, k, n, l.chunk[b])
				}
				if n > 0 && (from != next || (from-bk.Offset)%align != 0) {
					t.Fatalf("ranks %d bucket %d rank %d: starts at %d, want %d on a %d-element line", ranks, b, k, from, next, align)
				}
				next += n
				for i := range l.chunk[b] {
					used[l.slot(b, k)+i]++
				}
			}
			if next != bk.Offset+bk.Len {
				t.Fatalf("ranks %d bucket %d: chunks end at %d, want %d", ranks, b, next, bk.Offset+bk.Len)
			}
		}
		for i, u := range used {
			if u != 1 {
				t.Fatalf("ranks %d: inbox element %d is in %d slots, want 1", ranks, i, u)
			}
		}
	}
}

// Every (kind, bucket, rank) flag has a word of its own.
func TestFlagsDistinct(t *testing.T) {
	n := &Node{size: 5, buckets: make([]Span, 3), own: peermem.Local{FlagsOff: 1024}}
	seen := map[uint64]bool{}
	for kind := range flagKinds {
		for b := range n.buckets {
			for j := range n.size {
				f := uint64(n.flag(0, kind, b, j))
				if seen[f] || f < 1024 || f%4 != 0 {
					t.Fatalf("flag %d/%d/%d at %d: reused or misplaced", kind, b, j, f)
				}
				seen[f] = true
			}
		}
	}
}

// One rank, or no buckets, is refused before any CUDA call: a job of any
// size can ask for the transport and fall back.
func TestOpenRefusesWithoutCUDA(t *testing.T) {
	c := cpucommtest.Ranks(t, cpucomm.Config{Name: "node"}, 1)[0]
	do := func(f func() error) error { return f() }
	_, err := Open(context.Background(), c, do, Config{Grads: 1 << 20, Buckets: []Span{{0, 1024}}})
	var un *peermem.UnavailableError
	if !errors.As(err, &un) || un.Rank != 0 {
		t.Fatalf("one rank: %v, want an UnavailableError of rank 0", err)
	}
}

func TestSharesGPU(t *testing.T) {
	a := record{node: 1, busID: "0000:00:06.0"}
	b := record{node: 1, busID: "0000:00:07.0"}
	other := record{node: 2, busID: "0000:00:06.0"}
	for _, c := range []struct {
		recs []record
		want bool
	}{
		{[]record{a, b}, false},
		{[]record{a, other}, false},
		{[]record{a, b, a}, true},
		{[]record{a, a, a, a}, true},
	} {
		if got := sharesGPU(c.recs); got != c.want {
			t.Errorf("sharesGPU(%+v) = %t, want %t", c.recs, got, c.want)
		}
	}
}
