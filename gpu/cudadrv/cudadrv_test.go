package cudadrv

import (
	"errors"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/gotrain/gotrain/internal/testing/gputest"
)

func TestOpenNotFoundIsOneLine(t *testing.T) {
	_, err := open([]string{"libcuda-gotrain-missing.so.1", "/nonexistent/libcuda.so.1"})
	if !errors.Is(err, ErrNotFound) {
		t.Fatalf("open: %v, want ErrNotFound", err)
	}
	msg := err.Error()
	if strings.Contains(msg, "\n") {
		t.Errorf("error should be one line: %q", msg)
	}
	for _, want := range []string{"CUDA driver not found", "/nonexistent/libcuda.so.1", "install the NVIDIA driver"} {
		if !strings.Contains(msg, want) {
			t.Errorf("error lacks %q: %s", want, msg)
		}
	}
}

func TestCallsBeforeLoad(t *testing.T) {
	if loaded != nil {
		t.Skip("driver already loaded")
	}
	if _, err := MemAlloc(16); !errors.Is(err, ErrNotLoaded) {
		t.Fatalf("MemAlloc before Load: %v, want ErrNotLoaded", err)
	}
}

func TestErrorText(t *testing.T) {
	e := &Error{Op: "cuMemAlloc", Code: 2, Name: "CUDA_ERROR_OUT_OF_MEMORY", Message: "out of memory"}
	if got, want := e.Error(), "cudadrv: cuMemAlloc: CUDA_ERROR_OUT_OF_MEMORY: out of memory"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
}

// TestLoad passes with and without a GPU; without one it shows the message.
func TestLoad(t *testing.T) {
	d, err := Load()
	if err != nil {
		if strings.Contains(err.Error(), "\n") {
			t.Errorf("Load's error should be one line: %q", err)
		}
		t.Logf("no CUDA driver here: %v", err)
		return
	}
	t.Logf("CUDA driver %s (%d) from %s", d.VersionString(), d.Version(), d.Path())
}

func TestGPU(t *testing.T) {
	d, err := Load()
	if err != nil {
		gputest.Skipf(t, "needs the CUDA driver and a GPU: %v", err)
	}
	n, err := d.DeviceCount()
	if err != nil || n == 0 {
		gputest.Skipf(t, "no GPU (%d, %v)", n, err)
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	for i := 0; i < n; i++ {
		dev, err := d.Device(i)
		if err != nil {
			t.Fatal(err)
		}
		name, err1 := dev.Name()
		bus, err2 := dev.PCIBusID()
		maj, min, err3 := dev.ComputeCapability()
		mem, err4 := dev.TotalMem()
		if err := errors.Join(err1, err2, err3, err4); err != nil {
			t.Fatal(err)
		}
		t.Logf("GPU %d: %s, PCI %s, sm_%d%d, %d MiB", i, name, bus, maj, min, mem>>20)
		if name == "" || bus == "" || maj == 0 || mem == 0 {
			t.Errorf("GPU %d: empty facts", i)
		}
		ctx, err := dev.RetainPrimaryContext()
		if err != nil {
			t.Fatal(err)
		}
		if err := ctx.SetCurrent(); err != nil {
			t.Fatal(err)
		}
		if cur, err := CurrentContext(); err != nil || cur != ctx {
			t.Fatalf("current context %#x, %v; want %#x", cur, err, ctx)
		}
		exercise(t, i)
		if err := dev.ReleasePrimaryContext(); err != nil {
			t.Fatal(err)
		}
	}
}

// exercise checks memory, streams and events on the current context.
func exercise(t *testing.T, gpu int) {
	const n = 1 << 20
	p, err := MemAlloc(4 * n)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Free()
	if err := MemsetD32(p, 0xdeadbeef, n); err != nil {
		t.Fatal(err)
	}
	got := make([]uint32, n)
	if err := CopyFromDevice(got, p); err != nil {
		t.Fatal(err)
	}
	if got[0] != 0xdeadbeef || got[n-1] != 0xdeadbeef {
		t.Fatalf("MemsetD32: %#x %#x", got[0], got[n-1])
	}
	src := make([]uint32, n)
	for i := range src {
		src[i] = uint32(i * 3)
	}
	if err := CopyToDevice(p, src); err != nil {
		t.Fatal(err)
	}
	q, err := MemAlloc(4 * n)
	if err != nil {
		t.Fatal(err)
	}
	defer q.Free()
	if err := CopyDeviceToDevice(q, p, 4*n); err != nil {
		t.Fatal(err)
	}
	clear(got)
	if err := CopyFromDevice(got, q); err != nil {
		t.Fatal(err)
	}
	for i := range got {
		if got[i] != src[i] {
			t.Fatalf("round trip: element %d is %d, want %d", i, got[i], src[i])
		}
	}

	s, err := NewStream(StreamNonBlocking)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Destroy()
	start, err1 := NewEvent(EventDefault)
	end, err2 := NewEvent(EventDefault)
	if err := errors.Join(err1, err2); err != nil {
		t.Fatal(err)
	}
	defer start.Destroy()
	defer end.Destroy()
	if err := start.Record(s); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 20; i++ {
		if err := MemsetD8Async(p, byte(i), 4*n, s); err != nil {
			t.Fatal(err)
		}
	}
	if err := MemsetD32Async(q, 7, n, s); err != nil {
		t.Fatal(err)
	}
	if err := CopyToDeviceAsync(q, src[:16], s); err != nil {
		t.Fatal(err)
	}
	if err := end.Record(s); err != nil {
		t.Fatal(err)
	}
	if err := end.Synchronize(); err != nil {
		t.Fatal(err)
	}
	if done, err := end.Done(); !done || err != nil {
		t.Errorf("event after Synchronize: done=%v err=%v", done, err)
	}
	if done, err := s.Done(); !done || err != nil {
		t.Errorf("stream after its last event: done=%v err=%v", done, err)
	}
	el, err := Elapsed(start, end)
	if err != nil || el <= 0 || el > 10*time.Second {
		t.Errorf("Elapsed = %v, %v", el, err)
	}
	t.Logf("GPU %d: 20 async memsets of 4 MiB + 4 MiB memset + copy: %v GPU time", gpu, el)
	b := make([]byte, 4)
	if err := CopyFromDeviceAsync(b, p+4*n-4, s); err != nil || b[3] != 19 {
		t.Errorf("CopyFromDeviceAsync: % x, %v (want 19s)", b, err)
	}
	w := make([]uint32, 32)
	if err := CopyFromDeviceAsync(w, q, s); err != nil || w[15] != src[15] || w[16] != 7 {
		t.Errorf("async copy/memset result: %v, %v", w[14:18], err)
	}
	if err := Synchronize(); err != nil {
		t.Fatal(err)
	}
	// An error carries the driver's own name and text.
	_, err = MemAlloc(1 << 62)
	var ce *Error
	if !errors.As(err, &ce) || ce.Name == "" || ce.Message == "" {
		t.Errorf("MemAlloc(4 EiB): %v, want an *Error with the driver's name and text", err)
	} else {
		t.Logf("driver error: %v", err)
	}
}
