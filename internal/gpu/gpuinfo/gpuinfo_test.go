package gpuinfo

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

// TestOpen passes with and without a driver; without one it checks that
// Open fails cleanly, with one line that matches ErrNoDriver.
func TestOpen(t *testing.T) {
	n, err := Open()
	if err != nil {
		if strings.Contains(err.Error(), "\n") {
			t.Errorf("Open's error should be one line: %q", err)
		}
		if !errors.Is(err, ErrNoDriver) {
			t.Logf("NVML is there but failed: %v", err)
			return
		}
		if !strings.HasPrefix(err.Error(), "no NVIDIA driver found (NVML: ") {
			t.Errorf("error = %q", err)
		}
		t.Logf("no NVIDIA driver here: %v", err)
		return
	}
	defer n.Close()
	count, err := n.Count()
	if err != nil {
		t.Fatal(err)
	}
	drv, _ := n.DriverVersion()
	cuda, _ := n.CUDADriverVersion()
	t.Logf("driver %s, CUDA %d, %d GPU(s)", drv, cuda, count)
	for i := range count {
		d, err := n.Device(i)
		if err != nil {
			t.Fatal(err)
		}
		s, err := n.Sample(i)
		if err != nil {
			t.Fatal(err)
		}
		links, err := n.NVLinks(i)
		if err != nil {
			t.Fatal(err)
		}
		procs, _ := n.Processes(i)
		t.Logf("GPU %d: %+v\n  sample %+v\n  %d NVLinks, %d processes", i, d, s, len(links), len(procs))
		if d.UUID == "" || d.PCIBusID == "" || d.Name == "" {
			t.Errorf("GPU %d: empty identity %+v", i, d)
		}
	}
	w, err := n.WatchXID()
	if err != nil {
		t.Logf("XID events: %v", err)
		return
	}
	xids, err := w.Wait(0)
	t.Logf("XIDs now: %v %v", xids, err)
	w.Close()
}

func TestBusIDKey(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"00000000:07:00.0", "0000:07:00.0"},
		{"0000:07:00.0", "0000:07:00.0"},
		{"00000000:A1:00.0", "0000:a1:00.0"},
		{"00000001:00:06.0", "0001:00:06.0"},
		{"garbage", "garbage"},
	} {
		if got := BusIDKey(tc.in); got != tc.want {
			t.Errorf("BusIDKey(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestThrottle(t *testing.T) {
	if got := Throttle(0).String(); got != "none" {
		t.Errorf("none: %q", got)
	}
	th := ThrottleGPUIdle | ThrottleHwThermal | 0x10000
	if got, want := th.String(), "gpu_idle,hw_thermal_slowdown,unknown(0x10000)"; got != want {
		t.Errorf("String = %q, want %q", got, want)
	}
	b, err := json.Marshal(struct{ T Throttle }{ThrottleSwPowerCap})
	if err != nil || string(b) != `{"T":["sw_power_cap"]}` {
		t.Errorf("json: %s %v", b, err)
	}
	if ThrottleHarmful&ThrottleGPUIdle != 0 {
		t.Error("idle counted as harmful")
	}
}

func TestLevelString(t *testing.T) {
	want := map[Level]string{LevelSingle: "PIX", LevelMultiple: "PXB", LevelHostBridge: "PHB", LevelNode: "NODE", LevelSystem: "SYS"}
	for l, s := range want {
		if l.String() != s {
			t.Errorf("%d: %q, want %q", int(l), l.String(), s)
		}
	}
}

func TestBitsToIDs(t *testing.T) {
	got := bitsToIDs([]uint{0b1011, 1})
	want := []int{0, 1, 3, 64}
	if len(got) != len(want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	for i := range got {
		if got[i] != want[i] {
			t.Fatalf("got %v, want %v", got, want)
		}
	}
}

func TestFake(t *testing.T) {
	f := NewFakeNVLinked(2, 18, 32, "NVIDIA H200")
	var n NVML = f
	c, _ := n.Count()
	if c != 2 {
		t.Fatalf("count %d", c)
	}
	links, _ := n.NVLinks(0)
	if len(links) != 18 || links[0].RemotePCIBusID != f.Devices[1].PCIBusID {
		t.Errorf("links %v", links)
	}
	if _, err := n.Device(2); err == nil {
		t.Error("Device(2) of 2 should fail")
	}
	f.Update(func(f *Fake) { f.Err = ErrNotSupported })
	if _, err := n.Sample(0); !errors.Is(err, ErrNotSupported) {
		t.Errorf("Err not returned: %v", err)
	}
}
