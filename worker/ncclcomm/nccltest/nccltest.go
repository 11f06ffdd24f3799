// Package nccltest starts the NCCL ranks of a GPU test inside the test's
// process, one per GPU, so that packages built on the NCCL backend can test
// themselves across GPUs without a launcher.
package nccltest

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/gotrain/gotrain/gpu/cudadrv"
	"github.com/gotrain/gotrain/internal/testing/gputest"
	"github.com/gotrain/gotrain/nccl"
	"github.com/gotrain/gotrain/worker/comm/commtest"
	"github.com/gotrain/gotrain/worker/ncclcomm"
)

// Comms starts size ranks of a communicator called name, rank r on CUDA
// device r, all at once as NCCL's init needs, and closes them when the test
// ends. It skips the test when the CUDA driver, NCCL or size GPUs are
// missing.
func Comms(t testing.TB, size int, name string) []*ncclcomm.Comm {
	t.Helper()
	drv, err := cudadrv.Load()
	if err != nil {
		gputest.Skipf(t, "needs the CUDA driver and %d GPU(s): %v", size, err)
	}
	if n, err := drv.DeviceCount(); err != nil || n < size {
		gputest.Skipf(t, "needs %d GPU(s), found %d (%v)", size, n, err)
	}
	if _, err := nccl.Load(); err != nil {
		gputest.Skipf(t, "needs NCCL: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	store := commtest.NewMemStore()
	cs := make([]*ncclcomm.Comm, size)
	errs := make([]error, size)
	var wg sync.WaitGroup
	for r := range size {
		wg.Go(func() {
			cs[r], errs[r] = ncclcomm.New(ctx, ncclcomm.Config{Name: name, Rank: r, Size: size, Device: r, Store: store})
		})
	}
	wg.Wait()
	t.Cleanup(func() {
		for _, c := range cs {
			if c != nil {
				c.Close()
			}
		}
	})
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	return cs
}
