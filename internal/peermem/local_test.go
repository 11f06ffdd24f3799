package peermem

import (
	"slices"
	"sync"
	"testing"

	"github.com/gotrain/gotrain/worker/comm/commtest"
	"github.com/gotrain/gotrain/worker/cpucomm"
)

// Exchange hands every rank every rank's record in rank order; Agree is
// true only when no rank has a reason, and every rank hears the same.
func TestExchangeAndAgree(t *testing.T) {
	const size = 3
	store := commtest.NewMemStore()
	type result struct {
		recs       [][]int32
		all, allOK bool
		err        error
	}
	res := make([]result, size)
	var wg sync.WaitGroup
	for r := range size {
		wg.Go(func() {
			c, err := cpucomm.New(t.Context(), cpucomm.Config{Name: "peermem", Rank: r, Size: size, Host: "127.0.0.1", Store: store})
			if err != nil {
				res[r].err = err
				return
			}
			defer c.Close()
			if res[r].recs, err = Exchange(t.Context(), c, []int32{int32(r), int32(10 * r)}); err != nil {
				res[r].err = err
				return
			}
			if res[r].allOK, err = Agree(t.Context(), c, ""); err != nil {
				res[r].err = err
				return
			}
			reason := ""
			if r == 1 {
				reason = "rank 1 cannot map"
			}
			res[r].all, res[r].err = Agree(t.Context(), c, reason)
		})
	}
	wg.Wait()
	for r, got := range res {
		if got.err != nil {
			t.Fatalf("rank %d: %v", r, got.err)
		}
		for j, rec := range got.recs {
			if !slices.Equal(rec, []int32{int32(j), int32(10 * j)}) {
				t.Errorf("rank %d holds %v as rank %d's record", r, rec, j)
			}
		}
		if !got.allOK || got.all {
			t.Errorf("rank %d: Agree with no reason = %v, with rank 1's = %v; want true, false", r, got.allOK, got.all)
		}
	}
}

// A Local never set up (CUDA absent, or SetUp failing first) closes
// without touching the driver.
func TestLocalCloseEmpty(t *testing.T) {
	var l Local
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatalf("a second Close: %v", err)
	}
}
