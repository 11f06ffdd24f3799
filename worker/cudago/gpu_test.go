//go:build cuda

package cudago

// Tests on GPUs. They build with `go test -c -tags cuda` (make gpu builds
// bin/worker_cudago.test) and run on the GPU machine. Where there is no CUDA
// driver the binary cannot run at all: the loader finds no libcuda.so.1, or
// gorgonia.org/cu's init() exits. With a driver, each test skips, saying why,
// when it lacks GPUs or NCCL.

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/gotrain/gotrain/internal/testing/gputest"
	"github.com/gotrain/gotrain/nccl"
	"github.com/gotrain/gotrain/worker/comm"
	"github.com/gotrain/gotrain/worker/comm/commtest"
	"github.com/gotrain/gotrain/worker/ncclcomm"
	"gorgonia.org/cu"
)

// gpus skips unless at least min GPUs are here and returns how many are.
func gpus(t *testing.T, min int) int {
	t.Helper()
	n, err := cu.NumDevices()
	if err != nil || n < min {
		gputest.Skipf(t, "needs %d GPU(s), found %d (%v)", min, n, err)
	}
	return n
}

func onDevice(t *testing.T, ordinal int) *Device {
	t.Helper()
	d, err := OnDevice(ordinal)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := d.Close(); err != nil {
			t.Error(err)
		}
	})
	return d
}

func alloc[T comm.Element](t *testing.T, d *Device, n int) *DeviceBuffer[T] {
	t.Helper()
	b, err := Alloc[T](d, n)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := b.Free(); err != nil {
			t.Error(err)
		}
	})
	return b
}

func ramp(n int, scale float32) []float32 {
	s := make([]float32, n)
	for i := range s {
		s[i] = scale * float32(1+i%97)
	}
	return s
}

func equal(t *testing.T, what string, got, want []float32) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d elements, want %d", what, len(got), len(want))
	}
	for i := range got {
		if got[i] != want[i] {
			t.Fatalf("%s: element %d is %v, want %v", what, i, got[i], want[i])
		}
	}
}

func TestOnDeviceUnknownOrdinal(t *testing.T) {
	n := gpus(t, 1)
	if _, err := OnDevice(n); err == nil {
		t.Fatalf("OnDevice(%d) with %d device(s) succeeded", n, n)
	}
	if _, err := OnDevice(-1); err == nil {
		t.Fatal("OnDevice(-1) succeeded")
	}
}

func TestAllocCopyInOut(t *testing.T) {
	gpus(t, 1)
	d := onDevice(t, 0)
	const n = 1<<20 + 3
	b := alloc[float32](t, d, n)
	buf := b.Buffer()
	if !buf.OnDevice() || buf.Len() != n || buf.DType() != comm.Float32 || buf.DevicePointer() != uintptr(b.Ptr()) || b.Ptr() == 0 {
		t.Fatalf("Buffer() = device %v, len %d, %s, ptr %#x; want a float32 device buffer of %d at %#x",
			buf.OnDevice(), buf.Len(), buf.DType(), buf.DevicePointer(), n, uintptr(b.Ptr()))
	}
	want := ramp(n, 0.5)
	if err := b.CopyIn(want); err != nil {
		t.Fatal(err)
	}
	got := make([]float32, n)
	if err := b.CopyOut(got); err != nil {
		t.Fatal(err)
	}
	equal(t, "copy in, copy out", got, want)
	if err := b.CopyIn(make([]float32, n+1)); err == nil {
		t.Error("CopyIn of more elements than the buffer holds succeeded")
	}

	i64 := alloc[int64](t, d, 5)
	if i64.DType() != comm.Int64 || i64.Bytes() != 40 {
		t.Errorf("int64 buffer: %s, %d bytes; want int64, 40", i64.DType(), i64.Bytes())
	}
	empty := alloc[float64](t, d, 0)
	if err := empty.CopyIn(nil); err != nil || empty.Buffer().Len() != 0 {
		t.Errorf("empty buffer: CopyIn %v, Len %d", err, empty.Buffer().Len())
	}
}

func TestStreamRoundTrip(t *testing.T) {
	gpus(t, 1)
	d := onDevice(t, 0)
	s1, err := d.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	defer s1.Close()
	s2, err := d.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	if s1.Handle() == 0 || s1.Handle() == s2.Handle() {
		t.Fatalf("stream handles %#x and %#x: want two non-zero handles", s1.Handle(), s2.Handle())
	}
	if w := d.WrapStream(s1.Handle()); w.Handle() != s1.Handle() {
		t.Fatalf("WrapStream(%#x).Handle() = %#x", s1.Handle(), w.Handle())
	}

	const n = 4 << 20
	a := alloc[float32](t, d, n)
	b := alloc[float32](t, d, n)
	want := ramp(n, 2)
	// On s1: a ← want, b ← 0, then b ← a. On s2, after s1: read b.
	if err := a.CopyInOn(s1, want); err != nil {
		t.Fatal(err)
	}
	if err := b.ZeroOn(s1); err != nil {
		t.Fatal(err)
	}
	err = d.Do(func() error {
		return cu.MemcpyDtoDAsync(b.Ptr(), a.Ptr(), int64(a.Bytes()), s1.CU())
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := s2.WaitFor(s1); err != nil {
		t.Fatal(err)
	}
	got := make([]float32, n)
	if err := b.CopyOutOn(s2, got); err != nil {
		t.Fatal(err)
	}
	equal(t, "a → b on s1, read on s2 after WaitFor", got, want)

	// A wrapped stream is not destroyed by Close: s1 still works.
	if err := d.WrapStream(s1.Handle()).Close(); err != nil {
		t.Fatal(err)
	}
	if err := b.ZeroOn(s1); err != nil {
		t.Fatal(err)
	}
	if err := s1.Synchronize(); err != nil {
		t.Fatalf("s1 after closing a wrapper of it: %v", err)
	}
	if err := b.CopyOut(got[:1]); err != nil || got[0] != 0 {
		t.Fatalf("after ZeroOn: %v, %v", got[0], err)
	}
	if err := d.Synchronize(); err != nil {
		t.Fatal(err)
	}
}

func TestClosedDevice(t *testing.T) {
	gpus(t, 1)
	d, err := OnDevice(0)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	if err := d.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := Alloc[float32](d, 1); !errors.Is(err, ErrClosed) {
		t.Fatalf("Alloc after Close: %v, want ErrClosed", err)
	}
}

// TestAllReduceThroughNCCL runs one ncclcomm.Comm per GPU (1 or 2) as
// goroutine ranks; each rank's cudago Device uses the communicator's device,
// shares its primary context, and all-reduces a DeviceBuffer in place.
func TestAllReduceThroughNCCL(t *testing.T) {
	size := min(gpus(t, 1), 2)
	if _, err := nccl.Load(); err != nil {
		gputest.Skipf(t, "needs NCCL: %v", err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	store := commtest.NewMemStore()
	const n = 1<<20 + 5
	results := make([][]float32, size)
	errs := make([]error, size)
	var wg sync.WaitGroup
	for r := range size {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[r], errs[r] = allReduceRank(ctx, store, r, size, n)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	// rank r contributes (r+1)·ramp: the sum is size(size+1)/2 · ramp.
	want := ramp(n, float32(size*(size+1)/2))
	for r, got := range results {
		equal(t, fmt.Sprintf("all-reduce result of rank %d", r), got, want)
	}
	t.Logf("all-reduced %d float32 over %d rank(s)", n, size)
}

func allReduceRank(ctx context.Context, store comm.Store, rank, size, n int) ([]float32, error) {
	c, err := ncclcomm.New(ctx, ncclcomm.Config{Name: "cudago-test", Rank: rank, Size: size, Device: rank, Store: store})
	if err != nil {
		return nil, err
	}
	defer c.Close()
	d, err := OnDevice(c.Device())
	if err != nil {
		return nil, err
	}
	defer d.Close()

	var commCtx cu.CUContext
	if err := c.Do(func() (err error) { commCtx, err = cu.CurrentContext(); return err }); err != nil {
		return nil, err
	}
	if commCtx != d.Context() {
		return nil, errors.New("the communicator's current context is not the device's primary context cudago retained")
	}

	s, err := d.NewStream()
	if err != nil {
		return nil, err
	}
	defer s.Close()
	b, err := Alloc[float32](d, n)
	if err != nil {
		return nil, err
	}
	defer b.Free()
	if err := b.CopyInOn(s, ramp(n, float32(rank+1))); err != nil {
		return nil, err
	}
	commStream := d.WrapStream(c.Stream())
	defer commStream.Close()
	if err := commStream.WaitFor(s); err != nil {
		return nil, err
	}
	if err := c.AllReduce(ctx, b.Buffer(), b.Buffer(), comm.Sum); err != nil {
		return nil, err
	}
	out := make([]float32, n)
	if err := b.CopyOutOn(s, out); err != nil {
		return nil, err
	}
	return out, nil
}
