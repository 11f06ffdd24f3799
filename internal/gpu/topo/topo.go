// Package topo is a node's GPU topology as gotrain uses it: for each pair of
// GPUs how they talk (NV<n>: n bonded NVLinks; else the PCIe path PIX, PXB,
// PHB, NODE or SYS), and each GPU's NUMA node and CPU affinity. It reads
// NVML through package gpuinfo, so tests use gpuinfo.Fake.
//
// # Usage
//
//	n, err := gpuinfo.Open()
//	...
//	t, err := topo.Discover(n)
//	t.WriteMatrix(os.Stdout)      // like `nvidia-smi topo -m`
//	order := t.Chain()            // local ranks along NVLink
//	for _, w := range t.Warnings(order, os.Getenv) { ... }
package topo

import (
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/gotrain/gotrain/internal/gpu/gpuinfo"
)

// Link is how two GPUs talk.
type Link struct {
	Self bool
	// NVLinks is the number of bonded NVLinks between the two (directly or
	// through NVSwitches); 0 when they talk over PCIe.
	NVLinks int
	// Level is their closest common PCIe/CPU ancestor.
	Level gpuinfo.Level
}

// String returns nvidia-smi's cell: "X", "NV18", "PIX", "PXB", "PHB",
// "NODE" or "SYS".
func (l Link) String() string {
	switch {
	case l.Self:
		return "X"
	case l.NVLinks > 0:
		return "NV" + strconv.Itoa(l.NVLinks)
	}
	return l.Level.String()
}

// GPU is one GPU and where it sits.
type GPU struct {
	Index    int    `json:"index"`
	Name     string `json:"name"`
	UUID     string `json:"uuid"`
	PCIBusID string `json:"pci_bus_id"`
	// NUMANode is the nearest CPUs' NUMA node, -1 if unknown.
	NUMANode int `json:"numa_node"`
	// CPUs is the GPU's CPU affinity, ascending; empty if unknown.
	CPUs []int `json:"cpus"`
	// ActiveNVLinks counts the GPU's NVLinks that are up; SwitchNVLinks
	// those of them that go to an NVSwitch.
	ActiveNVLinks int `json:"active_nvlinks"`
	SwitchNVLinks int `json:"switch_nvlinks"`
}

// Topology is a node's GPUs and the links between them.
type Topology struct {
	GPUs []GPU
	// Links[i][j] is how GPU i talks to GPU j (Links[i][i].Self is true).
	Links [][]Link
}

// Discover asks NVML for the node's topology.
func Discover(n gpuinfo.NVML) (*Topology, error) {
	count, err := n.Count()
	if err != nil {
		return nil, fmt.Errorf("topo: count GPUs: %w", err)
	}
	t := &Topology{}
	links := make([][]gpuinfo.NVLink, count)
	byBus := map[string]int{}
	for i := range count {
		d, err := n.Device(i)
		if err != nil {
			return nil, fmt.Errorf("topo: %w", err)
		}
		t.GPUs = append(t.GPUs, GPU{Index: i, Name: d.Name, UUID: d.UUID, PCIBusID: d.PCIBusID, NUMANode: d.NUMANode, CPUs: d.CPUs})
		byBus[gpuinfo.BusIDKey(d.PCIBusID)] = i
		if links[i], err = n.NVLinks(i); err != nil {
			return nil, fmt.Errorf("topo: GPU %d NVLinks: %w", i, err)
		}
	}
	// direct[i][j]: links from i whose other end is GPU j.
	direct := make([][]int, count)
	for i := range count {
		direct[i] = make([]int, count)
		for _, l := range links[i] {
			if !l.Active {
				continue
			}
			t.GPUs[i].ActiveNVLinks++
			j, isGPU := byBus[gpuinfo.BusIDKey(l.RemotePCIBusID)]
			switch {
			case isGPU && !l.RemoteIsSwitch && j != i:
				direct[i][j]++
			case l.RemotePCIBusID != "" || l.RemoteIsSwitch:
				// An NVSwitch (or a device NVML does not list as a GPU).
				t.GPUs[i].SwitchNVLinks++
			}
		}
	}
	t.Links = make([][]Link, count)
	for i := range count {
		t.Links[i] = make([]Link, count)
		for j := range count {
			if i == j {
				t.Links[i][j] = Link{Self: true}
				continue
			}
			if j < i {
				t.Links[i][j] = t.Links[j][i]
				continue
			}
			lvl, err := n.CommonAncestor(i, j)
			if err != nil {
				return nil, fmt.Errorf("topo: %w", err)
			}
			nv := min(direct[i][j], direct[j][i])
			if nv == 0 {
				nv = max(direct[i][j], direct[j][i])
			}
			if nv == 0 && t.GPUs[i].SwitchNVLinks > 0 && t.GPUs[j].SwitchNVLinks > 0 {
				nv = min(t.GPUs[i].SwitchNVLinks, t.GPUs[j].SwitchNVLinks)
			}
			t.Links[i][j] = Link{NVLinks: nv, Level: lvl}
		}
	}
	return t, nil
}

// Chain orders the GPUs so that each is followed by the GPU it shares the
// most NVLinks with (ties: the closer over PCIe, then the lower index),
// starting from an end of the NVLink graph (the lowest-index GPU among those
// with the fewest NVLink peers). On fully connected GPUs it is 0, 1, 2, ...;
// the same topology always gives the same order.
func (t *Topology) Chain() []int {
	n := len(t.GPUs)
	if n == 0 {
		return nil
	}
	peers := func(i int) int {
		c := 0
		for j := range n {
			if j != i && t.Links[i][j].NVLinks > 0 {
				c++
			}
		}
		return c
	}
	start := 0
	for i := 1; i < n; i++ {
		pi, ps := peers(i), peers(start)
		if ps == 0 && pi > 0 || pi > 0 && pi < ps {
			start = i
		}
	}
	used := make([]bool, n)
	order := []int{start}
	used[start] = true
	for len(order) < n {
		cur := order[len(order)-1]
		best := -1
		for j := range n {
			if used[j] {
				continue
			}
			if best < 0 || better(t.Links[cur][j], t.Links[cur][best]) {
				best = j
			}
		}
		used[best] = true
		order = append(order, best)
	}
	return order
}

// better reports whether a is a closer link than b.
func better(a, b Link) bool {
	if a.NVLinks != b.NVLinks {
		return a.NVLinks > b.NVLinks
	}
	return a.Level < b.Level
}

// Warnings returns what a person should know before running NCCL on the
// GPUs gpus (indices): pairs without NVLink that talk over PCIe across NUMA
// nodes, and NCCL_P2P_DISABLE set in the environment getenv reads.
func (t *Topology) Warnings(gpus []int, getenv func(string) string) []string {
	var out []string
	sorted := slices.Clone(gpus)
	slices.Sort(sorted)
	for a, i := range sorted {
		for _, j := range sorted[a+1:] {
			if i < 0 || j < 0 || i >= len(t.Links) || j >= len(t.Links) {
				continue
			}
			l := t.Links[i][j]
			if l.NVLinks == 0 && l.Level == gpuinfo.LevelSystem {
				out = append(out, fmt.Sprintf("GPU%d and GPU%d have no NVLink and talk over PCIe across NUMA nodes (SYS): NCCL traffic between them crosses the CPU interconnect and will be slow; prefer GPUs of one NUMA node (see `gotrain topo`)", i, j))
			}
		}
	}
	if v := getenv("NCCL_P2P_DISABLE"); v != "" && v != "0" {
		out = append(out, fmt.Sprintf("NCCL_P2P_DISABLE=%s is set: NCCL will not use NVLink or PCIe peer-to-peer between GPUs and copies through host memory instead; unset it unless you are working around a broken P2P setup", v))
	}
	return out
}

// FormatCPUs writes CPU ids as ranges, like nvidia-smi: "0-31,64-95".
func FormatCPUs(cpus []int) string {
	if len(cpus) == 0 {
		return "N/A"
	}
	var parts []string
	for i := 0; i < len(cpus); {
		j := i
		for j+1 < len(cpus) && cpus[j+1] == cpus[j]+1 {
			j++
		}
		if i == j {
			parts = append(parts, strconv.Itoa(cpus[i]))
		} else {
			parts = append(parts, fmt.Sprintf("%d-%d", cpus[i], cpus[j]))
		}
		i = j + 1
	}
	return strings.Join(parts, ",")
}

func numaString(n int) string {
	if n < 0 {
		return "N/A"
	}
	return strconv.Itoa(n)
}

// WriteMatrix prints the topology as `nvidia-smi topo -m` does: the link
// matrix with each GPU's CPU and NUMA affinity, then a legend.
func (t *Topology) WriteMatrix(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	fmt.Fprint(tw, "\t")
	for i := range t.GPUs {
		fmt.Fprintf(tw, "GPU%d\t", i)
	}
	fmt.Fprintln(tw, "CPU Affinity\tNUMA Affinity\t")
	for i, g := range t.GPUs {
		fmt.Fprintf(tw, "GPU%d\t", i)
		for j := range t.GPUs {
			fmt.Fprintf(tw, "%s\t", t.Links[i][j])
		}
		fmt.Fprintf(tw, "%s\t%s\t\n", FormatCPUs(g.CPUs), numaString(g.NUMANode))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	_, err := io.WriteString(w, legend)
	return err
}

const legend = `
Legend:

  X    = Self
  SYS  = PCIe plus the link between NUMA nodes (e.g. QPI/UPI, Infinity Fabric)
  NODE = PCIe plus the link between PCIe host bridges of one NUMA node
  PHB  = PCIe through a PCIe host bridge (usually the CPU)
  PXB  = PCIe through several PCIe bridges, no host bridge
  PIX  = PCIe through at most one PCIe bridge
  NV#  = a bonded set of # NVLinks
`

// jsonTopology is the stable --json form.
type jsonTopology struct {
	GPUs   []GPU      `json:"gpus"`
	Matrix [][]string `json:"matrix"`
	Chain  []int      `json:"nvlink_order"`
	Error  string     `json:"error,omitempty"`
}

// MarshalJSON writes {"gpus": [...], "matrix": [["X","NV18"],...],
// "nvlink_order": [...]}; a nil Topology writes empty lists.
func (t *Topology) MarshalJSON() ([]byte, error) {
	return json.Marshal(t.jsonForm(""))
}

func (t *Topology) jsonForm(errMsg string) jsonTopology {
	j := jsonTopology{GPUs: []GPU{}, Matrix: [][]string{}, Chain: []int{}, Error: errMsg}
	if t == nil {
		return j
	}
	for _, g := range t.GPUs {
		if g.CPUs == nil {
			g.CPUs = []int{}
		}
		j.GPUs = append(j.GPUs, g)
	}
	for i := range t.Links {
		row := make([]string, len(t.Links[i]))
		for k, l := range t.Links[i] {
			row[k] = l.String()
		}
		j.Matrix = append(j.Matrix, row)
	}
	if c := t.Chain(); c != nil {
		j.Chain = c
	}
	return j
}

// EmptyJSON is the --json answer on a machine without GPUs: empty lists and
// the reason.
func EmptyJSON(reason string) ([]byte, error) {
	var t *Topology
	return json.Marshal(t.jsonForm(reason))
}
