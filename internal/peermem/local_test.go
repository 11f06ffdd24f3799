package peermem

import (
	"slices"
	"testing"

	"github.com/gotrain/gotrain/worker/cpucomm"
	"github.com/gotrain/gotrain/worker/cpucomm/cpucommtest"
)

// Exchange hands every rank every rank's record in rank order; Agree is
// true only when no rank has a reason, and every rank hears the same.
func TestExchangeAndAgree(t *testing.T) {
	comms := cpucommtest.Ranks(t, cpucomm.Config{Name: "peermem"}, 3)
	type result struct {
		recs       [][]int32
		all, allOK bool
	}
	res := make([]result, len(comms))
	errs := cpucommtest.Each(comms, func(r int, c *cpucomm.Comm) (err error) {
		if res[r].recs, err = Exchange(t.Context(), c, []int32{int32(r), int32(10 * r)}); err != nil {
			return err
		}
		if res[r].allOK, err = Agree(t.Context(), c, ""); err != nil {
			return err
		}
		reason := ""
		if r == 1 {
			reason = "rank 1 cannot map"
		}
		res[r].all, err = Agree(t.Context(), c, reason)
		return err
	})
	for r, got := range res {
		if errs[r] != nil {
			t.Fatalf("rank %d: %v", r, errs[r])
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
