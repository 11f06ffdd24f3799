package cpucommtest

import (
	"testing"

	"github.com/gotrain/gotrain/worker/comm"
	"github.com/gotrain/gotrain/worker/cpucomm"
)

// The ranks form one communicator: an all-reduce over them sees every
// rank's value, on every rank.
func TestRanksFormOneCommunicator(t *testing.T) {
	comms := Ranks(t, cpucomm.Config{Name: "cpucommtest"}, 3)
	sums := make([]int32, len(comms))
	errs := Each(comms, func(r int, c *cpucomm.Comm) error {
		if c.Rank() != r || c.Size() != 3 {
			t.Errorf("rank %d is rank %d of %d", r, c.Rank(), c.Size())
		}
		v := []int32{int32(r + 1)}
		err := c.AllReduce(t.Context(), comm.Host(v), comm.Host(v), comm.Sum)
		sums[r] = v[0]
		return err
	})
	for r, err := range errs {
		if err != nil || sums[r] != 6 {
			t.Errorf("rank %d: sum %d, %v; want 6", r, sums[r], err)
		}
	}
}
