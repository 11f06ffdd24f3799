package ncclcomm

// Tests that need the CUDA driver, NCCL and GPUs. Each runs one Comm per GPU
// as goroutines of this process (rank i on device i) over an in-memory Store,
// and skips, saying why, where something is missing.

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gotrain/gotrain/gpu/cudadrv"
	"github.com/gotrain/gotrain/internal/testing/gputest"
	"github.com/gotrain/gotrain/nccl"
	"github.com/gotrain/gotrain/worker/comm"
	"github.com/gotrain/gotrain/worker/comm/commtest"
)

// gpus skips unless the driver, NCCL and at least min GPUs are here.
func gpus(t testing.TB, min int) int {
	t.Helper()
	drv, err := cudadrv.Load()
	if err != nil {
		gputest.Skipf(t, "needs the CUDA driver and %d GPU(s): %v", min, err)
	}
	n, err := drv.DeviceCount()
	if err != nil || n < min {
		gputest.Skipf(t, "needs %d GPU(s), found %d (%v)", min, n, err)
	}
	lib, err := nccl.Load()
	if err != nil {
		gputest.Skipf(t, "needs NCCL: %v", err)
	}
	t.Logf("NCCL %s, %d GPUs, CUDA driver %s", lib.Version(), n, drv.VersionString())
	return n
}

// newComms creates one Comm per GPU, concurrently, as every rank must.
func newComms(t testing.TB, n int, name string) []*Comm {
	t.Helper()
	store := commtest.NewMemStore()
	comms := make([]*Comm, n)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	start := time.Now()
	err := onAll(n, func(r int) (err error) {
		comms[r], err = New(ctx, Config{Name: name, Rank: r, Size: n, Device: r, Store: store})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("New: %d ranks in %v", n, time.Since(start).Round(time.Millisecond))
	t.Cleanup(func() {
		if err := onAll(n, func(r int) error { return comms[r].Close() }); err != nil {
			t.Error(err)
		}
	})
	return comms
}

func onAll(n int, f func(r int) error) error {
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		wg.Add(1)
		go func() { defer wg.Done(); errs[r] = f(r) }()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// val is element i of rank r's input: small integers, exact in every type.
func val(r, i int) float64 { return float64(1 + (i+5*r)%23) }

func fill[T comm.Element](r, n int) []T {
	s := make([]T, n)
	for i := range s {
		s[i] = T(val(r, i))
	}
	return s
}

func reduce(op comm.Op, vs []float64, intType bool) float64 {
	acc := vs[0]
	for _, v := range vs[1:] {
		switch op {
		case comm.Sum, comm.Avg:
			acc += v
		case comm.Max:
			acc = max(acc, v)
		case comm.Min:
			acc = min(acc, v)
		}
	}
	if op == comm.Avg {
		acc /= float64(len(vs))
		if intType {
			acc = math.Trunc(acc)
		}
	}
	return acc
}

func checkSlice[T comm.Element](got []T, want func(i int) float64) error {
	for i, g := range got {
		w := want(i)
		if math.Abs(float64(g)-w) > 1e-6*math.Abs(w) {
			return fmt.Errorf("element %d is %v, want %v", i, g, w)
		}
	}
	return nil
}

// hostCollectives runs every collective of comm.Comm on host buffers of T.
func hostCollectives[T comm.Element](t *testing.T, comms []*Comm, count int) {
	n := len(comms)
	ctx := t.Context()
	var zero T
	intType := T(1)/2 == zero
	for _, op := range []comm.Op{comm.Sum, comm.Avg, comm.Max, comm.Min} {
		err := onAll(n, func(r int) error {
			send, recv := fill[T](r, count), make([]T, count)
			if err := comms[r].AllReduce(ctx, comm.Host(send), comm.Host(recv), op); err != nil {
				return err
			}
			return checkSlice(recv, func(i int) float64 {
				vs := make([]float64, n)
				for q := range vs {
					vs[q] = val(q, i)
				}
				return reduce(op, vs, intType)
			})
		})
		if err != nil {
			t.Fatalf("AllReduce %s: %v", op, err)
		}
	}
	err := onAll(n, func(r int) error { // in place
		buf := fill[T](r, count)
		if err := comms[r].AllReduce(ctx, comm.Host(buf), comm.Host(buf), comm.Sum); err != nil {
			return err
		}
		return checkSlice(buf, func(i int) float64 {
			s := 0.0
			for q := range n {
				s += val(q, i)
			}
			return s
		})
	})
	if err != nil {
		t.Fatalf("AllReduce in place: %v", err)
	}
	root := n - 1
	err = onAll(n, func(r int) error {
		buf := fill[T](r, count)
		if err := comms[r].Broadcast(ctx, comm.Host(buf), root); err != nil {
			return err
		}
		return checkSlice(buf, func(i int) float64 { return val(root, i) })
	})
	if err != nil {
		t.Fatalf("Broadcast: %v", err)
	}
	err = onAll(n, func(r int) error {
		send, recv := fill[T](r, count), make([]T, n*count)
		if err := comms[r].AllGather(ctx, comm.Host(send), comm.Host(recv)); err != nil {
			return err
		}
		return checkSlice(recv, func(i int) float64 { return val(i/count, i%count) })
	})
	if err != nil {
		t.Fatalf("AllGather: %v", err)
	}
	err = onAll(n, func(r int) error {
		send, recv := fill[T](r, n*count), make([]T, count)
		if err := comms[r].ReduceScatter(ctx, comm.Host(send), comm.Host(recv), comm.Sum); err != nil {
			return err
		}
		return checkSlice(recv, func(i int) float64 {
			s := 0.0
			for q := range n {
				s += val(q, r*count+i)
			}
			return s
		})
	})
	if err != nil {
		t.Fatalf("ReduceScatter: %v", err)
	}
}

func TestGPUHostBuffers(t *testing.T) {
	n := gpus(t, 2)
	comms := newComms(t, n, "host")
	for _, count := range []int{1, 1000, 1 << 20} {
		t.Run(fmt.Sprintf("float32/%d", count), func(t *testing.T) { hostCollectives[float32](t, comms, count) })
	}
	t.Run("float64", func(t *testing.T) { hostCollectives[float64](t, comms, 4097) })
	t.Run("int32", func(t *testing.T) { hostCollectives[int32](t, comms, 4097) })
	t.Run("int64", func(t *testing.T) { hostCollectives[int64](t, comms, 4097) })
	t.Run("Barrier", func(t *testing.T) {
		if err := onAll(n, func(r int) error { return comms[r].Barrier(t.Context()) }); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("BadShapeNamesRank", func(t *testing.T) {
		err := comms[0].AllReduce(t.Context(), comm.Host(make([]float32, 2)), comm.Host(make([]float32, 3)), comm.Sum)
		if err == nil || !strings.Contains(err.Error(), "rank 0") {
			t.Fatalf("mismatched shapes: %v", err)
		}
	})
}

// TestGPUDeviceBuffers runs collectives on device memory, synchronous and
// Async, and checks the result.
func TestGPUDeviceBuffers(t *testing.T) {
	n := gpus(t, 2)
	comms := newComms(t, n, "device")
	const count = 1 << 20
	err := onAll(n, func(r int) error {
		c := comms[r]
		var send, recv cudadrv.DevicePtr
		err := c.Do(func() (err error) {
			if send, err = cudadrv.MemAlloc(4 * count); err != nil {
				return err
			}
			if recv, err = cudadrv.MemAlloc(4 * n * count); err != nil {
				return err
			}
			return cudadrv.CopyToDevice(send, fill[float32](r, count))
		})
		if err != nil {
			return err
		}
		defer c.Do(func() error { send.Free(); recv.Free(); return nil })
		sb := comm.Device(uintptr(send), count, comm.Float32)
		rb := comm.Device(uintptr(recv), count, comm.Float32)
		read := func(k int) ([]float32, error) {
			out := make([]float32, k)
			return out, c.Do(func() error { return cudadrv.CopyFromDevice(out, recv) })
		}
		sum := func(i int) float64 {
			s := 0.0
			for q := range n {
				s += val(q, i)
			}
			return s
		}
		if err := c.AllReduce(t.Context(), sb, rb, comm.Sum); err != nil {
			return err
		}
		got, err := read(count)
		if err == nil {
			err = checkSlice(got, sum)
		}
		if err != nil {
			return fmt.Errorf("AllReduce: %w", err)
		}
		// Async: several collectives queued, one wait.
		for range 3 {
			if err := c.AllReduceAsync(sb, rb, comm.Max); err != nil {
				return err
			}
		}
		if err := c.AllGatherAsync(sb, comm.Device(uintptr(recv), n*count, comm.Float32)); err != nil {
			return err
		}
		if err := c.Synchronize(t.Context()); err != nil {
			return err
		}
		got, err = read(n * count)
		if err == nil {
			err = checkSlice(got, func(i int) float64 { return val(i/count, i%count) })
		}
		if err != nil {
			return fmt.Errorf("AllGatherAsync: %w", err)
		}
		if err := c.AllReduceAsync(comm.Host(make([]float32, 4)), rb, comm.Sum); err == nil {
			return errors.New("AllReduceAsync took a host buffer")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestGPULatency measures what the Comm adds to NCCL: the hand-off to the
// communicator's thread, and a synchronous 8-byte all-reduce through the
// comm.Comm interface, against the same all-reduce back to back inside Do.
func TestGPULatency(t *testing.T) {
	n := gpus(t, 2)
	comms := newComms(t, n, "latency")
	const iters = 2000
	var handoff time.Duration
	c0 := comms[0]
	nop := func() error { return nil }
	for range 100 {
		c0.Do(nop)
	}
	start := time.Now()
	for range 20000 {
		c0.Do(nop)
	}
	handoff = time.Since(start) / 20000
	syncPer := make([]time.Duration, n)
	asyncPer := make([]time.Duration, n)
	rawPer := make([]time.Duration, n)
	err := onAll(n, func(r int) error {
		c := comms[r]
		var buf cudadrv.DevicePtr
		if err := c.Do(func() (err error) { buf, err = cudadrv.MemAlloc(8); return err }); err != nil {
			return err
		}
		defer c.Do(func() error { return buf.Free() })
		b := comm.Device(uintptr(buf), 2, comm.Float32)
		ctx := context.Background()
		for range 200 {
			if err := c.AllReduce(ctx, b, b, comm.Sum); err != nil {
				return err
			}
		}
		start := time.Now()
		for range iters {
			if err := c.AllReduce(ctx, b, b, comm.Sum); err != nil {
				return err
			}
		}
		syncPer[r] = time.Since(start) / iters
		start = time.Now()
		for range iters {
			if err := c.AllReduceAsync(b, b, comm.Sum); err != nil {
				return err
			}
		}
		if err := c.Synchronize(ctx); err != nil {
			return err
		}
		asyncPer[r] = time.Since(start) / iters
		return c.Do(func() error {
			s := c.Stream()
			start := time.Now()
			for range iters {
				if err := c.NCCL().AllReduce(uintptr(buf), uintptr(buf), 2, nccl.Float32, nccl.Sum, s); err != nil {
					return err
				}
			}
			if err := cudadrv.Stream(c.Stream()).Synchronize(); err != nil {
				return err
			}
			rawPer[r] = time.Since(start) / iters
			return nil
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("hand-off to the comm's thread (Do, no-op): %v per call", handoff)
	t.Logf("8-byte all-reduce, %d ranks: synchronous through comm.Comm %v/op; AllReduceAsync back to back %v/op; raw NCCL inside Do %v/op",
		n, slowest(syncPer), slowest(asyncPer), slowest(rawPer))
}

func slowest(ds []time.Duration) time.Duration {
	var m time.Duration
	for _, d := range ds {
		m = max(m, d)
	}
	return m.Round(10 * time.Nanosecond)
}

// TestGPUMissingPeerDoesNotHang: rank 0 of 2 alone must give up when its
// context ends, naming itself, instead of waiting for ever.
func TestGPUMissingPeerDoesNotHang(t *testing.T) {
	gpus(t, 1)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
	defer cancel()
	start := time.Now()
	c, err := New(ctx, Config{Name: "lonely", Rank: 0, Size: 2, Device: 0, Store: commtest.NewMemStore()})
	took := time.Since(start)
	if err == nil {
		c.Close()
		t.Fatal("New of rank 0 of 2 without rank 1 succeeded")
	}
	if !strings.Contains(err.Error(), "rank 0") || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("error should name rank 0 and the deadline: %v", err)
	}
	if took > 10*time.Second {
		t.Errorf("New took %v after a 2s deadline", took)
	}
	t.Logf("after %v: %v", took.Round(time.Millisecond), err)
}

// TestGPUCollectiveTimeout: rank 0 all-reduces, rank 1 never does; rank 0's
// context ends, the communicator is aborted and the call returns.
func TestGPUCollectiveTimeout(t *testing.T) {
	n := gpus(t, 2)
	comms := newComms(t, n, "timeout")
	// Together once, so that the connections exist; then rank 0 alone.
	if err := onAll(n, func(r int) error {
		return comms[r].AllReduce(t.Context(), comm.Host(make([]float32, 1024)), comm.Host(make([]float32, 1024)), comm.Sum)
	}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
	defer cancel()
	start := time.Now()
	err := comms[0].AllReduce(ctx, comm.Host(make([]float32, 1024)), comm.Host(make([]float32, 1024)), comm.Sum)
	if err == nil || !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "rank 0") {
		t.Fatalf("AllReduce without peers: %v", err)
	}
	t.Logf("after %v: %v", time.Since(start).Round(time.Millisecond), err)
	// The peer notices through its own deadline, or is aborted directly.
	if err := comms[1].Abort(); err != nil {
		t.Errorf("Abort: %v", err)
	}
	if err := comms[1].Barrier(t.Context()); err == nil {
		t.Error("Barrier after Abort succeeded")
	}
}

// PrewarmComm makes and destroys its one-rank communicator, and a
// communicator made afterwards works and reports when the warm-up ended.
func TestGPUPrewarmComm(t *testing.T) {
	gpus(t, 1)
	warmMu.Lock()
	delete(warms, 0) // a warm-up by an earlier test would make this one a no-op
	warmMu.Unlock()
	start := time.Now()
	PrewarmComm(0)
	c, err := New(t.Context(), Config{Name: "after-warm", Rank: 0, Size: 1, Device: 0})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	tm := c.Timings()
	if tm.WarmComm.IsZero() {
		t.Fatal("Timings().WarmComm is zero: the warm-up communicator was not made (or New did not wait for it)")
	}
	if tm.Init.Before(tm.WarmComm) {
		t.Errorf("New's init ended at %v, before the warm-up's communicator (%v): New must wait for it", tm.Init, tm.WarmComm)
	}
	t.Logf("warm-up communicator done after %v; New's init took %v", tm.WarmComm.Sub(start).Round(time.Millisecond), tm.Init.Sub(tm.ID).Round(time.Millisecond))
}

// AllocSymmetric gives every rank a registered buffer that an in-place
// all-reduce sums correctly, and frees it (deregistration is collective).
func TestGPUAllocSymmetric(t *testing.T) {
	n := gpus(t, 2)
	comms := newComms(t, n, "symmetric")
	if !comms[0].Library().Has("ncclCommWindowRegister") {
		gputest.Skipf(t, "NCCL %s predates ncclCommWindowRegister (2.27)", comms[0].Library().Version())
	}
	const count = 1 << 20
	err := onAll(n, func(r int) error {
		c := comms[r]
		p, free, err := c.AllocSymmetric(4 * count)
		if err != nil {
			return err
		}
		buf := cudadrv.DevicePtr(p)
		if err := c.Do(func() error { return cudadrv.CopyToDevice(buf, fill[float32](r, count)) }); err != nil {
			return err
		}
		b := comm.Device(p, count, comm.Float32)
		if err := c.AllReduce(t.Context(), b, b, comm.Sum); err != nil {
			return err
		}
		got := make([]float32, count)
		if err := c.Do(func() error { return cudadrv.CopyFromDevice(got, buf) }); err != nil {
			return err
		}
		if err := checkSlice(got, func(i int) float64 {
			s := 0.0
			for q := range n {
				s += val(q, i)
			}
			return s
		}); err != nil {
			return fmt.Errorf("rank %d: all-reduce in a symmetric window: %w", r, err)
		}
		return free()
	})
	if err != nil {
		t.Fatal(err)
	}
}
