package placement

import (
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/gotrain/gotrain/internal/gpu/gpuinfo"
	"github.com/gotrain/gotrain/internal/gpu/topo"
	gotrainv1 "github.com/gotrain/gotrain/proto/gotrain/v1"
)

// WorkerGPUEnv returns the variables that show a worker the node's GPUs of
// the job, gpus (NVML indices) in local-rank order: CUDA_VISIBLE_DEVICES
// lists them, so that CUDA device i is local rank i's GPU, as torchrun's
// workers expect (PyTorch programs call torch.cuda.set_device(LOCAL_RANK)),
// and CUDA_DEVICE_ORDER=PCI_BUS_ID makes CUDA number GPUs as NVML does
// (CUDA's default order puts the fastest GPU first, which can differ).
// Package worker finds its own GPU (GOTRAIN_GPU) in the list
// (ncclcomm.DeviceFor); so does a standby, which sees the same list
// (standbyGPUs). `gotrain doctor` starts its placement
// probe with the same variables.
func WorkerGPUEnv(gpus []int) []string {
	ids := make([]string, len(gpus))
	for i, g := range gpus {
		ids[i] = strconv.Itoa(g)
	}
	return []string{"CUDA_DEVICE_ORDER=PCI_BUS_ID", "CUDA_VISIBLE_DEVICES=" + strings.Join(ids, ",")}
}

// Placement is where this node's workers go: the GPUs in NVLink order (the
// coordinator gives local rank i the i-th), and each GPU's CPUs.
type Placement struct {
	gpus     []*gotrainv1.GPU
	cpus     map[int][]int // NVML index → CPU ids
	warnings []string
}

// openNVML is gpuinfo.Open; tests replace it with a fake.
var openNVML = gpuinfo.Open

// discoverPlacement reads the node's topology. Without NVML (no driver, a
// CPU job) it returns an empty placement: workers are neither reordered nor
// pinned. nproc is how many GPUs the job uses; getenv reads the workers'
// environment for NCCL_P2P_DISABLE.
func discoverPlacement(nv gpuinfo.NVML, nproc int, getenv func(string) string) (*Placement, error) {
	t, err := topo.Discover(nv)
	if err != nil {
		return nil, err
	}
	p := &Placement{cpus: map[int][]int{}}
	order := t.Chain()
	for _, i := range order {
		g := t.GPUs[i]
		p.gpus = append(p.gpus, &gotrainv1.GPU{Index: int32(g.Index), Uuid: g.UUID, PciBusId: g.PCIBusID, Name: g.Name, NumaNode: int32(g.NUMANode)})
		p.cpus[g.Index] = g.CPUs
	}
	used := order
	if nproc > 0 && nproc < len(order) {
		used = order[:nproc]
	}
	p.warnings = t.Warnings(used, getenv)
	return p, nil
}

// Node is discoverPlacement on this machine's NVML for a job on backend
// whose workers' environment is env and that runs nproc ranks a node
// (--nproc-per-node); warnings go to stderr. Nil when there is no driver
// or the job does not use GPUs.
func Node(backend string, env []string, nproc int, stderr io.Writer, log *slog.Logger) *Placement {
	if backend != "nccl" {
		return nil
	}
	nv, err := openNVML()
	if err != nil {
		// On the NCCL backend a rank needs its GPU: say plainly that there
		// is no placement (gotrain launch has checked that GPUs are here).
		fmt.Fprintf(stderr, "gotrain: warning: no GPU placement (%v): ranks are not given a GPU each (every worker sees every GPU; Go workers take their local rank's), nor ordered along NVLink, nor pinned to CPUs; run gotrain doctor\n", err)
		return nil
	}
	defer nv.Close()
	vars := map[string]string{}
	for _, kv := range env {
		if k, v, ok := strings.Cut(kv, "="); ok {
			vars[k] = v
		}
	}
	p, err := discoverPlacement(nv, nproc, func(k string) string { return vars[k] })
	if err != nil {
		log.Warn("no GPU topology: workers are not reordered along NVLink nor pinned to CPUs", "err", err)
		return nil
	}
	for _, w := range p.warnings {
		fmt.Fprintf(stderr, "gotrain: warning: %s\n", w)
	}
	return p
}

// JoinGPUs is the node's GPUs for the coordinator, in NVLink order; nil
// without a placement.
func (p *Placement) JoinGPUs() []*gotrainv1.GPU {
	if p == nil {
		return nil
	}
	return p.gpus
}

// Pin restricts the worker pid to the CPUs of GPU gpu. It runs right after
// the worker started, so the worker's first instructions (before exec'ing
// the program, and anything the program does in its first microseconds) may
// run on other CPUs; threads it creates after that inherit the mask. A
// failure is logged, never fatal.
func (p *Placement) Pin(pid, gpu int, log *slog.Logger) {
	if p == nil || gpu < 0 {
		return
	}
	cpus := p.cpus[gpu]
	if len(cpus) == 0 {
		return // NVML knows no affinity
	}
	var set unix.CPUSet
	for _, c := range cpus {
		set.Set(c)
	}
	if err := unix.SchedSetaffinity(pid, &set); err != nil {
		log.Warn("pin worker to its GPU's CPUs", "pid", pid, "gpu", gpu, "cpus", topo.FormatCPUs(cpus), "err", err)
	}
}

// nvmlGPUCount returns NVML's GPU count, or why NVML cannot tell.
func nvmlGPUCount() (int, error) {
	nv, err := openNVML()
	if err != nil {
		return 0, err
	}
	defer nv.Close()
	return nv.Count()
}

// MultiRankEnv is what workers that share GPUs (ranksPerGPU > 1) need
// beside base, the environment given: NCCL_MULTI_RANK_GPU_ENABLE=1, without
// which NCCL ≥ 2.30 refuses a communicator with two ranks on one device,
// and, for more than two ranks per GPU, fewer channels per rank
// (NCCL_MAX_CTAS), since every rank allocates its own and NCCL hangs when
// the device runs out (NCCL's env.rst: two ranks per GPU fit the
// defaults). A value the user set is kept.
func MultiRankEnv(base []string, ranksPerGPU int) []string {
	if ranksPerGPU <= 1 {
		return nil
	}
	set := func(k string) bool {
		return slices.ContainsFunc(base, func(kv string) bool { return strings.HasPrefix(kv, k+"=") })
	}
	var env []string
	if !set("NCCL_MULTI_RANK_GPU_ENABLE") {
		env = append(env, "NCCL_MULTI_RANK_GPU_ENABLE=1")
	}
	if ranksPerGPU > 2 && !set("NCCL_MAX_CTAS") {
		env = append(env, "NCCL_MAX_CTAS="+strconv.Itoa(MultiRankMaxCTAs(ranksPerGPU)))
	}
	return env
}

// MultiRankMaxCTAs is the NCCL_MAX_CTAS workers get when ranksPerGPU
// (more than two) share one GPU.
func MultiRankMaxCTAs(ranksPerGPU int) int {
	return max(1, 16/ranksPerGPU)
}
