package nodereduce

import (
	"context"
	"fmt"
	"math"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/gotrain/gotrain/gpu/cudadrv"
	"github.com/gotrain/gotrain/internal/osthread"
	"github.com/gotrain/gotrain/internal/testing/gputest"
	"github.com/gotrain/gotrain/worker/comm/commtest"
	"github.com/gotrain/gotrain/worker/cpucomm"
)

// The GPU tests run N ranks in this process, all on GPU 0 (the case the
// package is for: several ranks on one GPU), with a CPU communicator for
// the exchange of handles. They share pointers; bench/nodereduce's runs
// under gotrain launch take the CUDA IPC path between processes. They skip
// without a GPU.

// TestMain gives the process's one CUDA context more hardware work queues
// than the 8 ranks' 16 streams: with CUDA's default of 8, two streams share
// a queue, and one stream's wait for a flag holds back the other's work
// that would raise one (a deadlock that ranks in processes of their own,
// each with its own context, never meet).
func TestMain(m *testing.M) {
	if os.Getenv("CUDA_DEVICE_MAX_CONNECTIONS") == "" {
		os.Setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32")
	}
	os.Exit(m.Run())
}

type gpuRank struct {
	ex    *osthread.Executor
	c     *cpucomm.Comm
	node  *Node
	grads cudadrv.DevicePtr
	cp    cudadrv.Stream
	sum   cudadrv.Stream
}

// startRanks starts size ranks with gradient buffers of n elements each
// inside a larger allocation (at an odd element offset, as a parameter
// slab may place them) and opens their Nodes.
func startRanks(t *testing.T, size, n int, buckets []Span) []*gpuRank {
	t.Helper()
	drv, err := cudadrv.Load()
	if err != nil {
		gputest.Skipf(t, "needs the CUDA driver and a GPU: %v", err)
	}
	if cnt, err := drv.DeviceCount(); err != nil || cnt < 1 {
		gputest.Skipf(t, "needs a GPU, found %d (%v)", cnt, err)
	}
	dev, err := drv.Device(0)
	if err != nil {
		t.Fatal(err)
	}
	store := commtest.NewMemStore()
	rs := make([]*gpuRank, size)
	errs := make([]error, size)
	var wg sync.WaitGroup
	for r := range size {
		wg.Go(func() {
			g := &gpuRank{}
			rs[r] = g
			g.ex, errs[r] = osthread.Start(func() error {
				pctx, err := dev.RetainPrimaryContext()
				if err != nil {
					return err
				}
				return pctx.SetCurrent()
			}, func() { _ = dev.ReleasePrimaryContext() })
			if errs[r] != nil {
				return
			}
			errs[r] = g.ex.Do(func() error {
				var err error
				if g.grads, err = cudadrv.MemAlloc(4 * (n + 7)); err != nil {
					return err
				}
				if g.cp, err = cudadrv.NewStream(cudadrv.StreamNonBlocking); err != nil {
					return err
				}
				g.sum, err = cudadrv.NewStream(cudadrv.StreamNonBlocking)
				return err
			})
			if errs[r] != nil {
				return
			}
			if g.c, errs[r] = cpucomm.New(t.Context(), cpucomm.Config{Name: "node", Rank: r, Size: size, Host: "127.0.0.1", Store: store}); errs[r] != nil {
				return
			}
			g.node, errs[r] = Open(context.Background(), g.c, g.ex.Do, Config{Grads: uintptr(g.grads + 4*3), Buckets: buckets})
		})
	}
	wg.Wait()
	t.Cleanup(func() {
		for _, g := range rs {
			if g == nil || g.ex == nil {
				continue
			}
			_ = g.ex.Do(func() error {
				_ = g.cp.Synchronize()
				_ = g.sum.Synchronize()
				if g.node != nil {
					_ = g.node.Close()
				}
				_ = g.cp.Destroy()
				_ = g.sum.Destroy()
				return g.grads.Free()
			})
			if g.c != nil {
				g.c.Close()
			}
			g.ex.Stop()
		}
	})
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	return rs
}

// value is rank r's gradient element i at step s: different on each rank
// and step, with a fraction, so that the sum rounds; some are -0.
func value(r, s, i int) float32 {
	if i%1001 == 0 {
		return float32(math.Copysign(0, -1))
	}
	return float32(math.Sin(float64(i+1)*0.37+float64(s)) * float64(1+r) * 1.3e-3)
}

// want is the reduction as the kernel defines it: the ranks' values added
// in rank order, then scaled.
func want(size, s, i int, scale float32) float32 {
	acc := value(0, s, i)
	for r := 1; r < size; r++ {
		acc += value(r, s, i)
	}
	return acc * scale
}

// Several steps over uneven buckets (smaller than one chunk per rank, not a
// multiple of four, at odd offsets): every element on every rank is the
// rank-order sum × 1/N, bitwise.
func TestGPUNodeAverages(t *testing.T) {
	buckets := []Span{{0, 5}, {5, 1<<20 + 3}, {1<<20 + 8, 4096}, {1<<20 + 4104, 777_777}}
	n := buckets[3].Offset + buckets[3].Len
	for _, size := range []int{2, 3, 4, 8} {
		t.Run(fmt.Sprintf("ranks=%d", size), func(t *testing.T) {
			rs := startRanks(t, size, n, buckets)
			scale := float32(1 / float64(size))
			got := make([][]float32, size)
			errs := make([]error, size)
			for s := 1; s <= 3; s++ {
				var wg sync.WaitGroup
				for r, g := range rs {
					wg.Go(func() {
						got[r] = make([]float32, n)
						errs[r] = g.ex.Do(func() error { return g.step(r, s, scale, got[r]) })
					})
				}
				wg.Wait()
				for r, err := range errs {
					if err != nil {
						t.Fatalf("step %d rank %d: %v", s, r, err)
					}
				}
				for i := range n {
					w := math.Float32bits(want(size, s, i, scale))
					for r := range size {
						if math.Float32bits(got[r][i]) != w {
							t.Fatalf("step %d element %d: rank %d has %v, want %v", s, i, r, got[r][i], math.Float32frombits(w))
						}
					}
				}
			}
		})
	}
}

// step fills rank r's gradients for step s, reduces every bucket as
// DataParallel does (copies on one stream, sums on another) and reads the
// result back into out.
func (g *gpuRank) step(r, s int, scale float32, out []float32) error {
	host := make([]float32, len(out))
	for i := range host {
		host[i] = value(r, s, i)
	}
	grads := g.grads + 4*3
	if err := cudadrv.CopyToDevice(grads, host); err != nil {
		return err
	}
	for b := range g.node.buckets {
		if err := g.node.Send(b, uintptr(g.cp)); err != nil {
			return err
		}
		if err := g.node.Reduce(b, scale, uintptr(g.sum)); err != nil {
			return err
		}
	}
	g.node.Next()
	if err := g.cp.Synchronize(); err != nil {
		return err
	}
	if err := g.sum.Synchronize(); err != nil {
		return err
	}
	return cudadrv.CopyFromDevice(out, grads)
}

// A rank whose peers never send waits on the device; Release (what an
// abort of the communicator runs) lets it go on.
func TestGPUNodeReleaseUnblocks(t *testing.T) {
	rs := startRanks(t, 4, 1024, []Span{{0, 1024}})
	g := rs[0]
	if err := g.ex.Do(func() error { return g.node.Reduce(0, 0.25, uintptr(g.sum)) }); err != nil {
		t.Fatal(err)
	}
	done := func() bool {
		var d bool
		_ = g.ex.Do(func() error { var err error; d, err = g.sum.Done(); return err })
		return d
	}
	time.Sleep(100 * time.Millisecond)
	if done() {
		t.Fatal("the reduction finished although no other rank sent its chunk")
	}
	g.node.Release() // rank 0's stream waits on rank 0's flags only
	deadline := time.Now().Add(20 * time.Second)
	for !done() {
		if time.Now().After(deadline) {
			t.Fatal("the stream still waits 20 s after Release")
		}
		time.Sleep(time.Millisecond)
	}
}
