// Package cpucommtest starts every rank of a CPU communicator in one
// process, over loopback, for the tests of what is built on collectives
// (DataParallel, the copy-engine transports' agreement).
package cpucommtest

import (
	"sync"
	"testing"

	"github.com/gotrain/gotrain/worker/comm/commtest"
	"github.com/gotrain/gotrain/worker/cpucomm"
)

// Ranks starts size ranks of a communicator configured as cfg (its Rank,
// Size, Store and an empty Host filled in here), all at once as a job's
// ranks do, and closes them when the test ends. A rank that cannot start
// fails the test.
func Ranks(t testing.TB, cfg cpucomm.Config, size int) []*cpucomm.Comm {
	t.Helper()
	store := commtest.NewMemStore()
	comms := make([]*cpucomm.Comm, size)
	errs := make([]error, size)
	var wg sync.WaitGroup
	for r := range size {
		c := cfg
		c.Rank, c.Size, c.Store = r, size, store
		if c.Host == "" {
			c.Host = "127.0.0.1"
		}
		wg.Go(func() { comms[r], errs[r] = cpucomm.New(t.Context(), c) })
	}
	wg.Wait()
	t.Cleanup(func() {
		for _, c := range comms {
			if c != nil {
				c.Close()
			}
		}
	})
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d of %d: start the CPU communicator %q: %v", r, size, cfg.Name, err)
		}
	}
	return comms
}

// Each calls f on every rank at once (collectives need all of them) and
// returns each rank's error.
func Each(comms []*cpucomm.Comm, f func(r int, c *cpucomm.Comm) error) []error {
	errs := make([]error, len(comms))
	var wg sync.WaitGroup
	for r, c := range comms {
		wg.Go(func() { errs[r] = f(r, c) })
	}
	wg.Wait()
	return errs
}
