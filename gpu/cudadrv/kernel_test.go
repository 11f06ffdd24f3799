package cudadrv

import (
	"errors"
	"runtime"
	"strings"
	"testing"

	"github.com/gotrain/gotrain/internal/testing/gputest"
)

func TestAXPYPTX(t *testing.T) {
	for _, tc := range []struct {
		major, minor int
		target       string
	}{{9, 0, ".target sm_75"}, {7, 0, ".target sm_70"}, {8, 6, ".target sm_75"}, {6, 1, ".target sm_60"}, {5, 2, ".target sm_52"}} {
		ptx := AXPYPTX(tc.major, tc.minor)
		if !strings.Contains(ptx, tc.target+"\n") || !strings.Contains(ptx, ".entry "+AXPYName+"(") || strings.Contains(ptx, "%!") || strings.Contains(ptx, "%%") {
			t.Errorf("AXPYPTX(%d, %d):\n%s", tc.major, tc.minor, ptx)
		}
	}
}

func TestLaunchBeforeLoad(t *testing.T) {
	if loaded != nil {
		t.Skip("driver already loaded")
	}
	if _, err := LoadModule(AXPYPTX(9, 0)); !errors.Is(err, ErrNotLoaded) {
		t.Errorf("LoadModule before Load: %v, want ErrNotLoaded", err)
	}
	if err := Function(0).Launch(Dim3{X: 1}, Dim3{X: 1}, 0, 0, DevicePtr(0), struct{}{}); err == nil || !strings.Contains(err.Error(), "unsupported type") {
		t.Errorf("Launch with a struct: %v", err)
	}
}

// TestGPUKernel runs the AXPY kernel on device 0 and checks every element.
func TestGPUKernel(t *testing.T) {
	d, err := Load()
	if err != nil {
		gputest.Skipf(t, "needs the CUDA driver and a GPU: %v", err)
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	dev, err := d.Device(0)
	if err != nil {
		t.Fatal(err)
	}
	ctx, err := dev.RetainPrimaryContext()
	if err != nil {
		t.Fatal(err)
	}
	defer dev.ReleasePrimaryContext()
	if err := ctx.SetCurrent(); err != nil {
		t.Fatal(err)
	}
	major, minor, err := dev.ComputeCapability()
	if err != nil {
		t.Fatal(err)
	}
	mod, err := LoadModule(AXPYPTX(major, minor))
	if err != nil {
		t.Fatal(err)
	}
	defer mod.Unload()
	fn, err := mod.Function(AXPYName)
	if err != nil {
		t.Fatal(err)
	}
	const n = 1<<20 + 3
	x, y := make([]float32, n), make([]float32, n)
	for i := range x {
		x[i], y[i] = float32(i%1000), 1
	}
	dx, _ := MemAlloc(4 * n)
	dy, _ := MemAlloc(4 * n)
	defer dx.Free()
	defer dy.Free()
	if err := CopyToDevice(dx, x); err != nil {
		t.Fatal(err)
	}
	if err := CopyToDevice(dy, y); err != nil {
		t.Fatal(err)
	}
	if err := fn.Launch(Dim3{X: (n + 255) / 256}, Dim3{X: 256}, 0, 0, dy, dx, float32(2), uint32(n)); err != nil {
		t.Fatal(err)
	}
	if err := Synchronize(); err != nil {
		t.Fatal(err)
	}
	if err := CopyFromDevice(y, dy); err != nil {
		t.Fatal(err)
	}
	for i, v := range y {
		if want := 2*float32(i%1000) + 1; v != want {
			t.Fatalf("y[%d] = %v, want %v", i, v, want)
		}
	}
}
