package doctor

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/gotrain/gotrain/internal/gpu/gpuinfo"
	"github.com/gotrain/gotrain/nccl"
)

// healthy is a Config for a healthy 2 × H200 node: NCCL 2.28.3, a passing
// smoke test and probe.
func healthy(f *gpuinfo.Fake) Config {
	return Config{
		NVML: f,
		NCCL: func() (NCCLInfo, error) {
			return NCCLInfo{Path: "libnccl.so.2", Version: nccl.MakeVersion(2, 28, 3)}, nil
		},
		Smoke: func(_ context.Context, gpus []gpuinfo.Device, withNCCL bool) (*SmokeResult, error) {
			res := &SmokeResult{}
			for _, g := range gpus {
				res.GPUs = append(res.GPUs, SmokeGPU{Index: g.Index, OK: true})
			}
			if withNCCL {
				res.AllReduce = &AllReduceResult{GPUs: len(gpus), Bytes: 256 << 20, Time: 900_000, AlgBW: 298, BusBW: 298, Correct: true}
			}
			for i := range gpus {
				for _, b := range gpus[i+1:] {
					res.Peers = append(res.Peers, PeerAccess{A: gpus[i].Index, B: b.Index, OK: true})
				}
			}
			return res, nil
		},
		Probe: func(_ context.Context, gpu int, _ []int) (string, error) {
			d, _ := f.Device(gpu)
			return strings.Replace(d.PCIBusID, "00000000:", "0000:", 1), nil // CUDA's form
		},
		Getenv:  func(string) string { return "" },
		SelfPID: 4242,
	}
}

func find(r *Report, name string) Check {
	for _, c := range r.Checks {
		if c.Name == name {
			return c
		}
	}
	return Check{Name: name, Status: "missing"}
}

// GPUs that cannot map each other's memory are a warning that says what
// it costs (NCCL instead of the copy engines) and what to look at.
func TestPeerAccessMissing(t *testing.T) {
	f := gpuinfo.NewFakeNVLinked(2, 18, 32, "NVIDIA H200")
	cfg := healthy(f)
	smoke := cfg.Smoke
	cfg.Smoke = func(ctx context.Context, gpus []gpuinfo.Device, withNCCL bool) (*SmokeResult, error) {
		res, err := smoke(ctx, gpus, withNCCL)
		res.Peers[0].OK = false
		return res, err
	}
	rep := Run(t.Context(), cfg)
	c := find(rep, "peer access")
	if c.Status != Warn || !strings.Contains(c.Detail, "GPU0↔GPU1") || !strings.Contains(c.Fix, "falls back to NCCL") {
		t.Errorf("peer access: %+v, want a warning naming GPU0↔GPU1 and the NCCL fallback", c)
	}
	if !rep.Healthy {
		t.Error("a missing peer path made the node unhealthy; it only costs speed")
	}
}

func TestHealthy(t *testing.T) {
	f := gpuinfo.NewFakeNVLinked(2, 18, 32, "NVIDIA H200")
	rep := Run(t.Context(), healthy(f))
	if !rep.Healthy {
		t.Errorf("not healthy: %+v", rep.Checks)
	}
	for _, c := range rep.Checks {
		if c.Status != OK {
			t.Errorf("check %s: %s %s", c.Name, c.Status, c.Detail)
		}
	}
	for _, name := range []string{"driver", "GPU0", "GPU1", "processes", "nccl", "ecc", "throttle", "temperature", "power", "topology", "smoke kernel", "smoke all-reduce", "peer access", "worker placement", "xid"} {
		if c := find(rep, name); c.Status != OK {
			t.Errorf("check %s: %s", name, c.Status)
		}
	}
	if d := find(rep, "topology").Detail; d != "GPU0-GPU1 NV18" {
		t.Errorf("topology detail %q", d)
	}
	if d := find(rep, "GPU1").Detail; !strings.Contains(d, "NVIDIA H200") || !strings.Contains(d, "00000000:19:00.0") || !strings.Contains(d, "140.4 GiB") {
		t.Errorf("GPU1 detail %q", d)
	}
	var out strings.Builder
	rep.WriteText(&out)
	if !strings.HasSuffix(out.String(), "gotrain doctor: all checks passed\n") || !strings.Contains(out.String(), "GPU0  X     NV18") {
		t.Errorf("text:\n%s", out.String())
	}
	b, err := json.Marshal(rep)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), `"healthy":true`) || !strings.Contains(string(b), `"busbw_gbs":298`) {
		t.Errorf("json: %s", b)
	}
}

func TestProblems(t *testing.T) {
	for _, tc := range []struct {
		name    string
		change  func(f *gpuinfo.Fake, c *Config)
		check   string
		status  Status
		detail  string
		fix     string
		healthy bool
	}{
		{
			name:   "hot GPU",
			change: func(f *gpuinfo.Fake, _ *Config) { f.Samples[1].TempC = 90 },
			check:  "temperature", status: Fail, detail: "GPU1 at 90 °C, slows down at 87 °C", fix: "cooling",
		},
		{
			name:   "warm GPU",
			change: func(f *gpuinfo.Fake, _ *Config) { f.Samples[0].TempC = 84 },
			check:  "temperature", status: Warn, detail: "GPU0 at 84 °C", fix: "cooling", healthy: true,
		},
		{
			name: "thermal throttling",
			change: func(f *gpuinfo.Fake, _ *Config) {
				f.Samples[0].Throttle = gpuinfo.ThrottleHwThermal | gpuinfo.ThrottleGPUIdle
			},
			check: "throttle", status: Fail, detail: "GPU0: hw_thermal_slowdown", fix: "cooling",
		},
		{
			name:   "uncorrected ECC",
			change: func(f *gpuinfo.Fake, _ *Config) { f.Samples[1].ECCUncorrected = 3 },
			check:  "ecc", status: Fail, detail: "GPU1: 3 uncorrected", fix: "reset",
		},
		{
			name:   "PCIe link at half width",
			change: func(f *gpuinfo.Fake, _ *Config) { f.Samples[1].PCIeWidth = 8 },
			check:  "pcie", status: Fail, detail: "GPU1: x8 of x16", fix: "reseat",
		},
		{
			name:   "PCIe link at a lower generation (idle)",
			change: func(f *gpuinfo.Fake, _ *Config) { f.Samples[0].PCIeGen = 1 },
			check:  "pcie", status: Warn, detail: "GPU0: gen 1 of 5", fix: "idle", healthy: true,
		},
		{
			name:   "corrected ECC",
			change: func(f *gpuinfo.Fake, _ *Config) { f.Samples[1].ECCCorrected = 7 },
			check:  "ecc", status: Warn, detail: "GPU1: 7 corrected", healthy: true,
		},
		{
			name:   "at power limit",
			change: func(f *gpuinfo.Fake, _ *Config) { f.Samples[0].PowerW = 699 },
			check:  "power", status: Warn, detail: "GPU0 draws 699 W of its 700 W limit", healthy: true,
		},
		{
			name: "another process",
			change: func(f *gpuinfo.Fake, _ *Config) {
				f.Procs = [][]gpuinfo.Process{{{PID: 4242}}, {{PID: 77, Name: "python3", UsedMemory: 2 << 30}}}
			},
			check: "processes", status: Warn, detail: "GPU1: pid 77 (python3) holds 2.0 GiB", fix: "stop them", healthy: true,
		},
		{
			name:   "XID",
			change: func(f *gpuinfo.Fake, _ *Config) { f.XIDs = []gpuinfo.XID{{GPU: 1, Code: 79}} },
			check:  "xid", status: Fail, detail: "GPU1: XID 79", fix: "fell off the bus",
		},
		{
			name: "old NCCL",
			change: func(_ *gpuinfo.Fake, c *Config) {
				c.NCCL = func() (NCCLInfo, error) {
					return NCCLInfo{Path: "/x/libnccl.so.2", Version: nccl.MakeVersion(2, 12, 0)}, nil
				}
			},
			check: "nccl", status: Fail, detail: "NCCL 2.12.0 at /x/libnccl.so.2 is older than 2.18.0", fix: "install NCCL 2.18.0",
		},
		{
			name: "no NCCL",
			change: func(_ *gpuinfo.Fake, c *Config) {
				c.NCCL = func() (NCCLInfo, error) { return NCCLInfo{}, errors.New("nccl: libnccl.so.2 not found") }
			},
			check: "nccl", status: Fail, detail: "not found", fix: "libnccl2",
		},
		{
			name: "P2P disabled",
			change: func(_ *gpuinfo.Fake, c *Config) {
				c.Getenv = func(k string) string { return map[string]string{"NCCL_P2P_DISABLE": "1"}[k] }
			},
			check: "topology", status: Warn, detail: "NCCL_P2P_DISABLE=1", fix: "leave NCCL_P2P_DISABLE unset", healthy: true,
		},
		{
			name: "wrong GPU",
			change: func(_ *gpuinfo.Fake, c *Config) {
				c.Probe = func(context.Context, int, []int) (string, error) { return "0000:18:00.0", nil }
			},
			check: "worker placement", status: Fail, detail: "GPU1 (00000000:19:00.0): the worker got the device at 0000:18:00.0", fix: "CUDA_VISIBLE_DEVICES",
		},
		{
			name: "kernel fails",
			change: func(_ *gpuinfo.Fake, c *Config) {
				c.Smoke = func(_ context.Context, gpus []gpuinfo.Device, _ bool) (*SmokeResult, error) {
					return &SmokeResult{GPUs: []SmokeGPU{{Index: 0, OK: true}, {Index: 1, Error: "cudadrv: cuMemAlloc: CUDA_ERROR_OUT_OF_MEMORY"}}}, nil
				}
			},
			check: "smoke kernel", status: Fail, detail: "GPU1: cudadrv: cuMemAlloc: CUDA_ERROR_OUT_OF_MEMORY", fix: "free its memory",
		},
		{
			name: "all-reduce wrong",
			change: func(_ *gpuinfo.Fake, c *Config) {
				c.Smoke = func(_ context.Context, gpus []gpuinfo.Device, _ bool) (*SmokeResult, error) {
					return &SmokeResult{GPUs: []SmokeGPU{{Index: 0, OK: true}, {Index: 1, OK: true}},
						AllReduce: &AllReduceResult{GPUs: 2, Bytes: 256 << 20, Mismatch: "GPU1: element 5 is 2, want 3"}}, nil
				}
			},
			check: "smoke all-reduce", status: Fail, detail: "wrong results: GPU1: element 5 is 2, want 3", fix: "ECC",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := gpuinfo.NewFakeNVLinked(2, 18, 32, "NVIDIA H200")
			cfg := healthy(f)
			tc.change(f, &cfg)
			rep := Run(t.Context(), cfg)
			c := find(rep, tc.check)
			if c.Status != tc.status || !strings.Contains(c.Detail, tc.detail) || !strings.Contains(c.Fix, tc.fix) {
				t.Errorf("check %s = %s %q (fix %q), want %s containing %q (fix with %q)", tc.check, c.Status, c.Detail, c.Fix, tc.status, tc.detail, tc.fix)
			}
			if rep.Healthy != tc.healthy {
				t.Errorf("healthy = %v, want %v", rep.Healthy, tc.healthy)
			}
			var out strings.Builder
			rep.WriteText(&out)
			if !tc.healthy && !strings.Contains(out.String(), "check(s) failed") {
				t.Errorf("text has no verdict:\n%s", out.String())
			}
			if !strings.Contains(out.String(), "fix: "+c.Fix) && tc.fix != "" {
				t.Errorf("text lacks the fix:\n%s", out.String())
			}
		})
	}
}

func TestNoGPUs(t *testing.T) {
	rep := Run(t.Context(), Config{NVML: &gpuinfo.Fake{Driver: "580"}})
	if rep.Healthy || find(rep, "driver").Status != Fail {
		t.Errorf("no GPUs should fail the driver check: %+v", rep.Checks)
	}
}

func TestNVMLBroken(t *testing.T) {
	f := gpuinfo.NewFakeNVLinked(2, 18, 32, "x")
	f.Err = errors.New("gpuinfo: nvmlDeviceGetCount: GPU is lost")
	rep := Run(t.Context(), Config{NVML: f})
	if rep.Healthy || !strings.Contains(find(rep, "driver").Detail, "GPU is lost") {
		t.Errorf("%+v", rep.Checks)
	}
}

// Without NVML the report is still a report: unhealthy, one failed driver
// check with the reason, and a fix naming the CPU backend.
func TestNoNVML(t *testing.T) {
	for _, tc := range []struct {
		err        error
		detail     string
		fixHasCPUs bool
	}{
		{&gpuinfo.NoDriverError{Reason: "libnvidia-ml.so.1 not loadable"}, "no NVIDIA driver found (libnvidia-ml.so.1 not loadable)", true},
		{errors.New("gpuinfo: NVML init: no permission"), "NVML does not start: gpuinfo: NVML init: no permission", true},
	} {
		rep := NoNVML(tc.err)
		if rep.Healthy || len(rep.Checks) != 1 || rep.Checks[0].Status != Fail || rep.Checks[0].Detail != tc.detail {
			t.Errorf("NoNVML(%v) = %+v; want unhealthy, one failed check %q", tc.err, rep, tc.detail)
		}
		if !strings.Contains(rep.Checks[0].Fix, "gotrain launch --backend cpu --nproc-per-node N") {
			t.Errorf("fix %q does not name the CPU backend's flags", rep.Checks[0].Fix)
		}
		if rep.GPUs == nil {
			t.Error("GPUs is nil: JSON would say null, not []")
		}
	}
}
