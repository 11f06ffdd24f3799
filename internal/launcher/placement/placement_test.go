package placement

import (
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/gotrain/gotrain/internal/gpu/gpuinfo"
	"golang.org/x/sys/unix"
)

// lineFake is 4 GPUs whose NVLinks form the line 0-2-1-3, GPUs 0,1 on NUMA
// node 0 and 2,3 on node 1, with the given PCIe levels.
func lineFake() *gpuinfo.Fake {
	f := &gpuinfo.Fake{Driver: "580", CUDADriver: 13000, Ancestors: map[[2]int]gpuinfo.Level{}}
	for i := range 4 {
		f.Devices = append(f.Devices, gpuinfo.Device{Name: "GPU", UUID: fmt.Sprintf("GPU-%d", i),
			PCIBusID: fmt.Sprintf("00000000:%02X:00.0", 0x10+i), NUMANode: i / 2, CPUs: []int{4 * i, 4*i + 1}})
	}
	f.Links = make([][]gpuinfo.NVLink, 4)
	link := func(a, b, n int) {
		for range n {
			f.Links[a] = append(f.Links[a], gpuinfo.NVLink{Link: len(f.Links[a]), Active: true, RemotePCIBusID: f.Devices[b].PCIBusID})
			f.Links[b] = append(f.Links[b], gpuinfo.NVLink{Link: len(f.Links[b]), Active: true, RemotePCIBusID: f.Devices[a].PCIBusID})
		}
	}
	link(0, 2, 4)
	link(2, 1, 4)
	link(1, 3, 2)
	return f
}

func TestPlacementOrdersAlongNVLink(t *testing.T) {
	p, err := discoverPlacement(lineFake(), 4, func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	var order []int
	var uuids []string
	for _, g := range p.JoinGPUs() {
		order = append(order, int(g.GetIndex()))
		uuids = append(uuids, g.GetUuid())
	}
	if want := []int{0, 2, 1, 3}; !slices.Equal(order, want) {
		t.Errorf("order %v, want %v", order, want)
	}
	if uuids[1] != "GPU-2" || p.JoinGPUs()[1].GetNumaNode() != 1 {
		t.Errorf("GPU facts lost: %v", p.JoinGPUs()[1])
	}
	if !slices.Equal(p.cpus[3], []int{12, 13}) {
		t.Errorf("GPU3 CPUs %v", p.cpus[3])
	}
	// 0-1 and 0-3 and 2-3 have no NVLink and default to SYS in the fake.
	if len(p.warnings) != 3 {
		t.Errorf("warnings %q", p.warnings)
	}
}

func TestPlacementWarnsOnlyForGPUsUsed(t *testing.T) {
	p, err := discoverPlacement(lineFake(), 2, func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	// The first two of the chain, 0 and 2, share NVLink.
	if len(p.warnings) != 0 {
		t.Errorf("warnings %q", p.warnings)
	}
	p, _ = discoverPlacement(lineFake(), 2, func(k string) string {
		if k == "NCCL_P2P_DISABLE" {
			return "1"
		}
		return ""
	})
	if len(p.warnings) != 1 || !strings.Contains(p.warnings[0], "NCCL_P2P_DISABLE") {
		t.Errorf("warnings %q", p.warnings)
	}
}

func TestNodePlacement(t *testing.T) {
	f := gpuinfo.NewFakeNVLinked(2, 18, 4, "NVIDIA H200")
	defer func(old func() (gpuinfo.NVML, error)) { openNVML = old }(openNVML)
	openNVML = func() (gpuinfo.NVML, error) { return f, nil }
	var stderr strings.Builder
	env := []string{"NCCL_P2P_DISABLE=1"}
	p := Node("nccl", env, 2, &stderr, slog.New(slog.DiscardHandler))
	if p == nil || len(p.JoinGPUs()) != 2 {
		t.Fatalf("placement %v", p)
	}
	if !f.Closed() {
		t.Error("NVML left open")
	}
	if !strings.Contains(stderr.String(), "gotrain: warning: NCCL_P2P_DISABLE=1") {
		t.Errorf("stderr %q", stderr.String())
	}
	if g := FindGPUs(); g.N != 2 || g.How != "NVML counts 2" {
		t.Errorf("FindGPUs = %+v", g)
	}
	if p := Node("cpu", env, 2, &stderr, slog.New(slog.DiscardHandler)); p != nil {
		t.Error("a CPU job got a GPU placement")
	}
	openNVML = func() (gpuinfo.NVML, error) { return nil, &gpuinfo.NoDriverError{Reason: "test"} }
	if g := FindGPUs(); !hasGPUDeviceFiles() && (g.N != 0 || !strings.Contains(g.How, "no /dev/nvidia0... device files; no NVIDIA driver found (NVML: test)")) {
		t.Errorf("FindGPUs without NVML = %+v: want none, saying why", g)
	}
	if p := Node("nccl", env, 2, &stderr, slog.New(slog.DiscardHandler)); p != nil || p.JoinGPUs() != nil {
		t.Error("no NVML should give no placement")
	}
	p.Pin(os.Getpid(), 0, slog.New(slog.DiscardHandler)) // a nil placement does nothing
}

func TestWorkerGPUEnv(t *testing.T) {
	if got := WorkerGPUEnv([]int{3}); !slices.Equal(got, []string{"CUDA_DEVICE_ORDER=PCI_BUS_ID", "CUDA_VISIBLE_DEVICES=3"}) {
		t.Errorf("WorkerGPUEnv([3]) = %q", got)
	}
	// Local-rank order, not index order: CUDA device i is local rank i's GPU.
	if got := WorkerGPUEnv([]int{2, 0, 3, 1}); !slices.Equal(got, []string{"CUDA_DEVICE_ORDER=PCI_BUS_ID", "CUDA_VISIBLE_DEVICES=2,0,3,1"}) {
		t.Errorf("WorkerGPUEnv([2 0 3 1]) = %q", got)
	}
}

// TestPin pins a child process to one CPU and reads its mask back.
func TestPin(t *testing.T) {
	var self unix.CPUSet
	if err := unix.SchedGetaffinity(0, &self); err != nil {
		t.Skip(err)
	}
	cpu := -1
	for c := range 1024 {
		if self.IsSet(c) {
			cpu = c
			break
		}
	}
	proc, err := os.StartProcess("/bin/sleep", []string{"sleep", "5"}, &os.ProcAttr{})
	if err != nil {
		t.Skip(err)
	}
	defer proc.Wait()
	defer proc.Kill()
	p := &Placement{cpus: map[int][]int{1: {cpu}}}
	p.Pin(proc.Pid, 1, slog.New(slog.DiscardHandler))
	var got unix.CPUSet
	if err := unix.SchedGetaffinity(proc.Pid, &got); err != nil {
		t.Fatal(err)
	}
	if got.Count() != 1 || !got.IsSet(cpu) {
		t.Errorf("child affinity has %d CPUs, want only CPU %d", got.Count(), cpu)
	}
}

func TestMultiRankEnv(t *testing.T) {
	tests := []struct {
		base   []string
		perGPU int
		want   []string
	}{
		{nil, 1, nil},
		{nil, 2, []string{"NCCL_MULTI_RANK_GPU_ENABLE=1"}},
		{nil, 8, []string{"NCCL_MULTI_RANK_GPU_ENABLE=1", "NCCL_MAX_CTAS=2"}},
		{[]string{"NCCL_MAX_CTAS=4"}, 8, []string{"NCCL_MULTI_RANK_GPU_ENABLE=1"}},
		{[]string{"NCCL_MULTI_RANK_GPU_ENABLE=1"}, 2, nil},
	}
	for _, tt := range tests {
		if got := MultiRankEnv(tt.base, tt.perGPU); !slices.Equal(got, tt.want) {
			t.Errorf("MultiRankEnv(%q, %d) = %q, want %q", tt.base, tt.perGPU, got, tt.want)
		}
	}
}

func hasGPUDeviceFiles() bool {
	m, _ := filepath.Glob("/dev/nvidia[0-9]*")
	return len(m) > 0
}
