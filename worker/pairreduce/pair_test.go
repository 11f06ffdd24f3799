package pairreduce

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
	for i := range r.handle {
		r.handle[i] = byte(255 - i)
	}
	r.ptr, r.node, r.process, r.busID = 0x7f00_1234_5000, 0xdead_beef_cafe_f00d, 42, "0000:00:07.0"
	w := r.encode()
	if len(w) != recordBytes/4 {
		t.Fatalf("encoded to %d words, want %d", len(w), recordBytes/4)
	}
	if got := decode(w); got != r {
		t.Fatalf("decode(encode(r)) = %+v, want %+v", got, r)
	}
}

// Three ranks cannot pair: every rank gets an UnavailableError before any
// CUDA call, so a job of any size can ask for the transport and fall back.
func TestOpenNeedsTwoRanks(t *testing.T) {
	comms := cpucommtest.Ranks(t, cpucomm.Config{Name: "pair"}, 3)
	errs := cpucommtest.Each(comms, func(r int, c *cpucomm.Comm) error {
		_, err := Open(context.Background(), c, func(f func() error) error { return f() }, Config{Elements: 1024, Buckets: 1})
		return err
	})
	for r, err := range errs {
		var un *peermem.UnavailableError
		if !errors.As(err, &un) || un.Rank != r {
			t.Errorf("rank %d: %v, want an UnavailableError of rank %d", r, err, r)
		}
	}
}
