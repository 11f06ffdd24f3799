package bench

import (
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/gotrain/gotrain/worker/comm"
	"github.com/gotrain/gotrain/worker/comm/commtest"
	"github.com/gotrain/gotrain/worker/cpucomm"
)

func BenchmarkCPUAllReduce(b *testing.B) {
	for _, ranks := range []int{2, 4} {
		b.Run(fmt.Sprintf("ranks=%d", ranks), func(b *testing.B) {
			comms := cpuMesh(b, ranks)
			for size := 4 << 10; size <= 64<<20; size *= 4 {
				b.Run("size="+sizeName(size), func(b *testing.B) {
					benchAllReduce(b, comms, size)
				})
			}
		})
	}
}

// benchAllReduce runs b.N float32 sum all-reduces of size bytes on every rank,
// back to back, out of place.
func benchAllReduce(b *testing.B, comms []*cpucomm.Comm, size int) {
	n := len(comms)
	send := make([][]float32, n)
	recv := make([][]float32, n)
	for r := range n {
		send[r] = make([]float32, size/4)
		recv[r] = make([]float32, size/4)
		for i := range send[r] {
			send[r][i] = float32(i % 7)
		}
	}
	allReduce := func(iters int) error {
		return onAll(comms, func(r int, c *cpucomm.Comm) error {
			for range iters {
				if err := c.AllReduce(b.Context(), comm.Host(send[r]), comm.Host(recv[r]), comm.Sum); err != nil {
					return err
				}
			}
			return nil
		})
	}
	if err := allReduce(1); err != nil { // warm up: scratch, socket buffers
		b.Fatal(err)
	}
	b.SetBytes(int64(size))
	b.ResetTimer()
	if err := allReduce(b.N); err != nil {
		b.Fatal(err)
	}
	b.StopTimer()
	algbw := float64(size) * float64(b.N) / b.Elapsed().Seconds()
	b.ReportMetric(algbw*2*float64(n-1)/float64(n)/1e9, "busbw-GB/s")
}

func cpuMesh(b *testing.B, size int) []*cpucomm.Comm {
	store := commtest.NewMemStore()
	comms := make([]*cpucomm.Comm, size)
	errs := make([]error, size)
	var wg sync.WaitGroup
	for r := range size {
		wg.Go(func() {
			comms[r], errs[r] = cpucomm.New(b.Context(), cpucomm.Config{
				Name: "bench", Rank: r, Size: size, Host: "127.0.0.1", Store: store,
			})
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		for _, c := range comms {
			c.Close()
		}
	})
	return comms
}

func onAll(comms []*cpucomm.Comm, f func(r int, c *cpucomm.Comm) error) error {
	errs := make([]error, len(comms))
	var wg sync.WaitGroup
	for r, c := range comms {
		wg.Go(func() { errs[r] = f(r, c) })
	}
	wg.Wait()
	return errors.Join(errs...)
}

func sizeName(n int) string {
	if n >= 1<<20 {
		return fmt.Sprintf("%dMiB", n>>20)
	}
	return fmt.Sprintf("%dKiB", n>>10)
}
