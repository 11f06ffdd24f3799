package topo

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/gotrain/gotrain/internal/gpu/gpuinfo"
)

// fake builds n GPUs with nv[i][j] direct NVLinks between i and j and PCIe
// levels lvl (pairs i<j; missing pairs are SYS). GPUs below n/2 sit on
// NUMA node 0 with CPUs 0-7, the others on node 1 with CPUs 8-15.
func fake(n int, nv map[[2]int]int, lvl map[[2]int]gpuinfo.Level) *gpuinfo.Fake {
	f := &gpuinfo.Fake{Driver: "580.159.04", CUDADriver: 13000, Ancestors: lvl}
	for i := range n {
		node, cpus := 0, []int{0, 1, 2, 3, 4, 5, 6, 7}
		if i >= (n+1)/2 {
			node, cpus = 1, []int{8, 9, 10, 11, 12, 13, 14, 15}
		}
		f.Devices = append(f.Devices, gpuinfo.Device{Name: "GPU", UUID: fmt.Sprintf("GPU-%d", i),
			PCIBusID: fmt.Sprintf("00000000:%02X:00.0", 0x10+i), NUMANode: node, CPUs: cpus})
	}
	f.Links = make([][]gpuinfo.NVLink, n)
	for pair, c := range nv {
		for _, ends := range [][2]int{{pair[0], pair[1]}, {pair[1], pair[0]}} {
			a, b := ends[0], ends[1]
			for range c {
				f.Links[a] = append(f.Links[a], gpuinfo.NVLink{Link: len(f.Links[a]), Active: true, RemotePCIBusID: f.Devices[b].PCIBusID})
			}
		}
	}
	return f
}

func matrix(t *Topology) string {
	var rows []string
	for i := range t.Links {
		var cells []string
		for j := range t.Links[i] {
			cells = append(cells, t.Links[i][j].String())
		}
		rows = append(rows, strings.Join(cells, " "))
	}
	return strings.Join(rows, "; ")
}

func TestDiscover(t *testing.T) {
	for _, tc := range []struct {
		name      string
		nvml      gpuinfo.NVML
		matrix    string
		chain     []int
		warnings  int
		nvlinks0  int
		switches0 int
	}{
		{
			name:     "2xH200 NV18",
			nvml:     gpuinfo.NewFakeNVLinked(2, 18, 32, "NVIDIA H200"),
			matrix:   "X NV18; NV18 X",
			chain:    []int{0, 1},
			nvlinks0: 18,
		},
		{
			name:      "8 GPUs on NVSwitches",
			nvml:      gpuinfo.NewFakeNVLinked(8, 18, 32, "NVIDIA H100"),
			matrix:    "X NV18 NV18 NV18 NV18 NV18 NV18 NV18; NV18 X NV18 NV18 NV18 NV18 NV18 NV18; NV18 NV18 X NV18 NV18 NV18 NV18 NV18; NV18 NV18 NV18 X NV18 NV18 NV18 NV18; NV18 NV18 NV18 NV18 X NV18 NV18 NV18; NV18 NV18 NV18 NV18 NV18 X NV18 NV18; NV18 NV18 NV18 NV18 NV18 NV18 X NV18; NV18 NV18 NV18 NV18 NV18 NV18 NV18 X",
			chain:     []int{0, 1, 2, 3, 4, 5, 6, 7},
			nvlinks0:  18,
			switches0: 18,
		},
		{
			name: "4 GPUs PCIe, two NUMA nodes",
			nvml: fake(4, nil, map[[2]int]gpuinfo.Level{{0, 1}: gpuinfo.LevelSingle, {2, 3}: gpuinfo.LevelMultiple}),
			// pairs across nodes are SYS: (0,2) (0,3) (1,2) (1,3)
			matrix:   "X PIX SYS SYS; PIX X SYS SYS; SYS SYS X PXB; SYS SYS PXB X",
			chain:    []int{0, 1, 2, 3},
			warnings: 4,
		},
		{
			name: "NVLink line 0-2-1-3",
			nvml: fake(4, map[[2]int]int{{0, 2}: 4, {1, 2}: 4, {1, 3}: 2}, map[[2]int]gpuinfo.Level{
				{0, 1}: gpuinfo.LevelNode, {0, 2}: gpuinfo.LevelNode, {0, 3}: gpuinfo.LevelNode,
				{1, 2}: gpuinfo.LevelNode, {1, 3}: gpuinfo.LevelNode, {2, 3}: gpuinfo.LevelNode}),
			matrix:   "X NODE NV4 NODE; NODE X NV4 NV2; NV4 NV4 X NODE; NODE NV2 NODE X",
			chain:    []int{0, 2, 1, 3},
			nvlinks0: 4,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			topo, err := Discover(tc.nvml)
			if err != nil {
				t.Fatal(err)
			}
			if got := matrix(topo); got != tc.matrix {
				t.Errorf("matrix\n got %s\nwant %s", got, tc.matrix)
			}
			if got := topo.Chain(); !slices.Equal(got, tc.chain) {
				t.Errorf("chain %v, want %v", got, tc.chain)
			}
			if g := topo.GPUs[0]; g.ActiveNVLinks != tc.nvlinks0 || g.SwitchNVLinks != tc.switches0 {
				t.Errorf("GPU0 links %d/%d, want %d/%d", g.ActiveNVLinks, g.SwitchNVLinks, tc.nvlinks0, tc.switches0)
			}
			ws := topo.Warnings(topo.Chain(), func(string) string { return "" })
			if len(ws) != tc.warnings {
				t.Errorf("%d warnings, want %d: %q", len(ws), tc.warnings, ws)
			}
		})
	}
}

func TestChainIsStable(t *testing.T) {
	f := fake(4, map[[2]int]int{{0, 2}: 4, {1, 2}: 4, {1, 3}: 2}, nil)
	first, _ := Discover(f)
	for range 20 {
		again, _ := Discover(f)
		if !slices.Equal(again.Chain(), first.Chain()) {
			t.Fatalf("chain changed: %v then %v", first.Chain(), again.Chain())
		}
	}
}

func TestWarningsP2PDisabled(t *testing.T) {
	topo, _ := Discover(gpuinfo.NewFakeNVLinked(2, 18, 32, "H200"))
	env := map[string]string{"NCCL_P2P_DISABLE": "1"}
	ws := topo.Warnings([]int{0, 1}, func(k string) string { return env[k] })
	if len(ws) != 1 || !strings.Contains(ws[0], "NCCL_P2P_DISABLE=1") {
		t.Errorf("warnings %q", ws)
	}
	env["NCCL_P2P_DISABLE"] = "0"
	if ws := topo.Warnings([]int{0, 1}, func(k string) string { return env[k] }); len(ws) != 0 {
		t.Errorf("NCCL_P2P_DISABLE=0 warned: %q", ws)
	}
}

func TestWarningsOnlyForGPUsUsed(t *testing.T) {
	topo, _ := Discover(fake(4, nil, map[[2]int]gpuinfo.Level{{0, 1}: gpuinfo.LevelSingle}))
	if ws := topo.Warnings([]int{1, 0}, func(string) string { return "" }); len(ws) != 0 {
		t.Errorf("GPUs 0 and 1 share a switch, got %q", ws)
	}
}

func TestWriteMatrix(t *testing.T) {
	topo, _ := Discover(gpuinfo.NewFakeNVLinked(2, 18, 32, "NVIDIA H200"))
	var b strings.Builder
	if err := topo.WriteMatrix(&b); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(b.String(), "\n")
	want := []string{
		"      GPU0  GPU1  CPU Affinity  NUMA Affinity",
		"GPU0  X     NV18  0-31          0",
		"GPU1  NV18  X     0-31          0",
	}
	for i, w := range want {
		if strings.TrimRight(lines[i], " ") != w {
			t.Errorf("line %d:\n got %q\nwant %q", i, lines[i], w)
		}
	}
	if !strings.Contains(b.String(), "NV#  = a bonded set of # NVLinks") {
		t.Errorf("no legend:\n%s", b.String())
	}
}

func TestFormatCPUs(t *testing.T) {
	for _, tc := range []struct {
		in   []int
		want string
	}{
		{nil, "N/A"},
		{[]int{3}, "3"},
		{[]int{0, 1, 2, 3, 8, 10, 11}, "0-3,8,10-11"},
	} {
		if got := FormatCPUs(tc.in); got != tc.want {
			t.Errorf("FormatCPUs(%v) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestJSON(t *testing.T) {
	b, err := EmptyJSON("no NVIDIA driver found (NVML: x)")
	if err != nil {
		t.Fatal(err)
	}
	if got, want := string(b), `{"gpus":[],"matrix":[],"nvlink_order":[],"error":"no NVIDIA driver found (NVML: x)"}`; got != want {
		t.Errorf("empty:\n got %s\nwant %s", got, want)
	}
	topo, _ := Discover(gpuinfo.NewFakeNVLinked(2, 18, 4, "NVIDIA H200"))
	b, err = json.Marshal(topo)
	if err != nil {
		t.Fatal(err)
	}
	var back struct {
		GPUs []struct {
			UUID string `json:"uuid"`
			CPUs []int  `json:"cpus"`
		} `json:"gpus"`
		Matrix [][]string `json:"matrix"`
	}
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if len(back.GPUs) != 2 || back.Matrix[0][1] != "NV18" || len(back.GPUs[1].CPUs) != 4 {
		t.Errorf("json: %s", b)
	}
}

func TestDiscoverError(t *testing.T) {
	f := gpuinfo.NewFakeNVLinked(2, 18, 4, "x")
	f.Err = gpuinfo.ErrNotSupported
	if _, err := Discover(f); err == nil {
		t.Error("no error")
	}
}
