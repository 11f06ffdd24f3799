package pairreduce

import (
	"fmt"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/gotrain/gotrain/gpu/cudadrv"
	"github.com/gotrain/gotrain/worker/ncclcomm"
	"github.com/gotrain/gotrain/worker/ncclcomm/nccltest"
)

// The GPU tests need two GPUs and skip without them (make gpu builds the
// binary; bench/gpu_check.sh runs it). Both ranks run in this process, so
// they share pointers; examples/mlp's runs under gotrain launch take the
// CUDA IPC path between processes.

func twoRanks(t testing.TB) []*ncclcomm.Comm { return nccltest.Comms(t, 2, "pair-test") }

func openBoth(t testing.TB, cs []*ncclcomm.Comm, cfg Config) []*Pair {
	t.Helper()
	ps := make([]*Pair, 2)
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for r, c := range cs {
		wg.Go(func() { ps[r], errs[r] = Open(t.Context(), c, c.Do, cfg) })
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	return ps
}

// value is rank r's gradient element i at step s: different on each rank
// and step, with a fraction, so that the sum rounds.
func value(r, s, i int) float32 {
	return float32(math.Sin(float64(i+1)*0.37+float64(s)) * float64(1+r) * 1.3e-3)
}

// Several steps over uneven buckets (one not a multiple of four elements,
// one at an odd offset): every element is (own + peer's) / 2 as float32
// arithmetic computes it, on both ranks, bitwise.
func TestGPUPairAverages(t *testing.T) {
	cs := twoRanks(t)
	sizes := []int{1<<20 + 3, 4096, 777_777}
	n := 0
	for _, s := range sizes {
		n += s
	}
	for _, lanes := range []int{1, 3} {
		t.Run(fmt.Sprintf("lanes=%d", lanes), func(t *testing.T) { testAverages(t, cs, sizes, n, lanes) })
	}
}

func testAverages(t *testing.T, cs []*ncclcomm.Comm, sizes []int, n, lanes int) {
	ps := openBoth(t, cs, Config{Elements: n, Buckets: len(sizes), Lanes: lanes})
	const steps = 4
	got := make([][]float32, 2)
	errs := make([]error, 2)
	for s := 1; s <= steps; s++ {
		var wg sync.WaitGroup
		for r, c := range cs {
			wg.Go(func() {
				got[r] = make([]float32, n)
				errs[r] = c.Do(func() error {
					return runStep(ps[r], r, s, sizes, got[r])
				})
			})
		}
		wg.Wait()
		for r, err := range errs {
			if err != nil {
				t.Fatalf("step %d rank %d: %v", s, r, err)
			}
		}
		for i := range n {
			want := (value(0, s, i) + value(1, s, i)) * 0.5
			if math.Float32bits(got[0][i]) != math.Float32bits(want) || math.Float32bits(got[1][i]) != math.Float32bits(want) {
				t.Fatalf("step %d element %d: rank 0 %v, rank 1 %v, want %v", s, i, got[0][i], got[1][i], want)
			}
		}
	}
	for r, c := range cs {
		if err := c.Do(ps[r].Close); err != nil {
			t.Errorf("rank %d: close: %v", r, err)
		}
	}
}

// runStep fills rank r's gradients for step s, reduces them bucket by
// bucket as DataParallel does (copies on one stream, sums on another) and
// reads the result back into out.
func runStep(p *Pair, r, s int, sizes []int, out []float32) error {
	n := len(out)
	host := make([]float32, n)
	for i := range host {
		host[i] = value(r, s, i)
	}
	g, err := cudadrv.MemAlloc(4 * n)
	if err != nil {
		return err
	}
	defer g.Free()
	if err := cudadrv.CopyToDevice(g, host); err != nil {
		return err
	}
	cp, err := cudadrv.NewStream(cudadrv.StreamNonBlocking)
	if err != nil {
		return err
	}
	defer cp.Destroy()
	sum, err := cudadrv.NewStream(cudadrv.StreamNonBlocking)
	if err != nil {
		return err
	}
	defer sum.Destroy()
	off := 0
	for b, size := range sizes {
		if err := p.Send(b, off, size, uintptr(g), uintptr(cp)); err != nil {
			return err
		}
		sent, err := cudadrv.NewEvent(cudadrv.EventDisableTiming)
		if err != nil {
			return err
		}
		defer sent.Destroy()
		if err := sent.Record(cp); err != nil {
			return err
		}
		if err := sum.WaitEvent(sent); err != nil {
			return err
		}
		if err := p.Sum(b, off, size, uintptr(g), 0.5, uintptr(sum)); err != nil {
			return err
		}
		off += size
	}
	p.Next()
	if err := sum.Synchronize(); err != nil {
		return err
	}
	return cudadrv.CopyFromDevice(out, g)
}

// A rank whose peer never sends waits on the device; Release (what an
// abort of the communicator runs) lets it go on.
func TestGPUPairReleaseUnblocks(t *testing.T) {
	cs := twoRanks(t)
	ps := openBoth(t, cs, Config{Elements: 1024, Buckets: 1})
	var sum cudadrv.Stream
	err := cs[0].Do(func() error {
		var err error
		if sum, err = cudadrv.NewStream(cudadrv.StreamNonBlocking); err != nil {
			return err
		}
		g, err := cudadrv.MemAlloc(4 * 1024)
		if err != nil {
			return err
		}
		return ps[0].Sum(0, 0, 1024, uintptr(g), 0.5, uintptr(sum))
	})
	if err != nil {
		t.Fatal(err)
	}
	done := func() bool {
		var d bool
		cs[0].Do(func() error { d, err = sum.Done(); return err })
		return d
	}
	time.Sleep(100 * time.Millisecond)
	if done() {
		t.Fatal("the sum ran although the peer never sent its gradients")
	}
	ps[0].Release()
	deadline := time.Now().Add(10 * time.Second)
	for !done() {
		if time.Now().After(deadline) {
			t.Fatal("the stream still waits 10 s after Release")
		}
		time.Sleep(time.Millisecond)
	}
	for r, c := range cs {
		c.Do(ps[r].Close)
	}
}

// benchSide is one rank's pair, gradients (1.0 everywhere) and two streams
// in a benchmark; benchSides frees them when the benchmark ends.
type benchSide struct {
	p   *Pair
	buf cudadrv.DevicePtr
	s   [2]cudadrv.Stream
}

func benchSides(b *testing.B, cs []*ncclcomm.Comm, n, lanes int) []benchSide {
	ps := openBoth(b, cs, Config{Elements: n, Buckets: 1, Lanes: lanes})
	sides := make([]benchSide, len(cs))
	for r, c := range cs {
		sd := &sides[r]
		sd.p = ps[r]
		err := c.Do(func() error {
			var err error
			if sd.buf, err = cudadrv.MemAlloc(4 * n); err != nil {
				return err
			}
			for i := range sd.s {
				if sd.s[i], err = cudadrv.NewStream(cudadrv.StreamNonBlocking); err != nil {
					return err
				}
			}
			return cudadrv.MemsetD32(sd.buf, 0x3f800000, n)
		})
		if err != nil {
			b.Fatal(err)
		}
	}
	b.Cleanup(func() {
		for r, c := range cs {
			sd := sides[r]
			c.Do(func() error {
				for _, s := range sd.s {
					s.Destroy()
				}
				sd.buf.Free()
				return sd.p.Close()
			})
		}
	})
	return sides
}

// onSides runs f for ranks 0 to n-1 at once, each on its communicator's
// thread.
func onSides(b *testing.B, cs []*ncclcomm.Comm, n int, f func(r int) error) {
	var wg sync.WaitGroup
	for r, c := range cs[:n] {
		wg.Go(func() {
			if err := c.Do(func() error { return f(r) }); err != nil {
				b.Error(err)
			}
		})
	}
	wg.Wait()
}

// BenchmarkGPUPairReduce averages 64 MiB between the two GPUs, both ranks
// at once as in training, over 1 to 8 copy lanes: what one bucket costs
// with nothing beside it. b.SetBytes counts one rank's gradients.
func BenchmarkGPUPairReduce(b *testing.B) {
	cs := twoRanks(b)
	const n = 16 << 20
	for _, lanes := range []int{1, 2, 4, 8} {
		b.Run(fmt.Sprintf("lanes=%d", lanes), func(b *testing.B) {
			sides := benchSides(b, cs, n, lanes)
			b.SetBytes(4 * n)
			b.ResetTimer()
			for range b.N {
				onSides(b, cs, 2, func(r int) error {
					sd := sides[r]
					cp, sum := sd.s[0], sd.s[1]
					if err := sd.p.Send(0, 0, n, uintptr(sd.buf), uintptr(cp)); err != nil {
						return err
					}
					if err := cp.Synchronize(); err != nil {
						return err
					}
					if err := sd.p.Sum(0, 0, n, uintptr(sd.buf), 1, uintptr(sum)); err != nil {
						return err
					}
					sd.p.Next()
					return sum.Synchronize()
				})
			}
			b.StopTimer()
		})
	}
}

// BenchmarkGPUPeerCopy is the copy alone, one direction or both at once,
// over 1 to 8 lanes: the copy engines' share of BenchmarkGPUPairReduce.
func BenchmarkGPUPeerCopy(b *testing.B) {
	cs := twoRanks(b)
	const n = 16 << 20
	for _, both := range []bool{false, true} {
		for _, lanes := range []int{1, 2, 4, 8} {
			b.Run(fmt.Sprintf("both=%t/lanes=%d", both, lanes), func(b *testing.B) {
				sides := benchSides(b, cs, n, lanes)
				ranks := 1
				if both {
					ranks = 2
				}
				b.SetBytes(4 * n)
				b.ResetTimer()
				for range b.N {
					onSides(b, cs, ranks, func(r int) error {
						sd := sides[r]
						if err := sd.p.copyOut(0, n, sd.buf, sd.s[0]); err != nil {
							return err
						}
						return sd.s[0].Synchronize()
					})
				}
				b.StopTimer()
			})
		}
	}
}
