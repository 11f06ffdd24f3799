// Package doctor is `gotrain doctor`: the checklist a GPU training node
// should pass before a job runs on it. Each check has a status and, when it
// is not ok, a hint saying how to fix it.
//
// The checks read NVML through gpuinfo.NVML and get everything else that
// touches a GPU (the NCCL version, the smoke test, the worker-placement
// probe) as functions in Config, so tests drive Run with gpuinfo.Fake and
// stubs; Smoke in this package is the real smoke test.
//
// # Usage
//
//	n, err := gpuinfo.Open()
//	...
//	rep := doctor.Run(ctx, doctor.Config{NVML: n, NCCL: doctor.LoadNCCL, Smoke: doctor.Smoke, Probe: probe})
//	rep.WriteText(os.Stdout)
//	if !rep.Healthy { os.Exit(1) }
package doctor

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/gotrain/gotrain/internal/gpu/gpuinfo"
	"github.com/gotrain/gotrain/internal/gpu/topo"
	"github.com/gotrain/gotrain/nccl"
)

// Status is a check's outcome.
type Status string

// The statuses. Only Fail makes the node unhealthy.
const (
	OK   Status = "ok"
	Warn Status = "warn"
	Fail Status = "fail"
	Skip Status = "skip"
)

// Check is one line of the checklist.
type Check struct {
	Name   string `json:"name"`
	Status Status `json:"status"`
	// Detail says what was found.
	Detail string `json:"detail"`
	// Fix says what to do when Status is not OK.
	Fix string `json:"fix,omitempty"`
}

// GPU is what doctor saw of one GPU.
type GPU struct {
	gpuinfo.Device
	Sample    gpuinfo.Sample    `json:"sample"`
	Processes []gpuinfo.Process `json:"processes"`
}

// NCCLInfo is the NCCL a worker would load.
type NCCLInfo struct {
	Path    string
	Version nccl.Version
}

// SmokeResult is what the smoke test found.
type SmokeResult struct {
	// GPUs has one entry per GPU tested, by NVML index.
	GPUs      []SmokeGPU       `json:"gpus"`
	AllReduce *AllReduceResult `json:"all_reduce,omitempty"`
	// Peers has, for every pair of GPUs tested, whether each can map the
	// other's memory (cuDeviceCanAccessPeer both ways): what DataParallel's
	// copy-engine transport needs for two ranks on them.
	Peers []PeerAccess `json:"peers,omitempty"`
}

// PeerAccess is whether two GPUs (NVML indices) can access each other's
// memory.
type PeerAccess struct {
	A, B  int
	OK    bool
	Error string `json:"error,omitempty"`
}

// SmokeGPU is the smoke test of one GPU: allocate, run a kernel, check.
type SmokeGPU struct {
	Index int    `json:"index"`
	OK    bool   `json:"ok"`
	Error string `json:"error,omitempty"`
}

// AllReduceResult is an NCCL all-reduce across every GPU of the node.
type AllReduceResult struct {
	GPUs  int           `json:"gpus"`
	Bytes int           `json:"bytes"`
	Time  time.Duration `json:"time_ns"`
	// AlgBW and BusBW are in GB/s, as nccl-tests computes them.
	AlgBW   float64 `json:"algbw_gbs"`
	BusBW   float64 `json:"busbw_gbs"`
	Correct bool    `json:"correct"`
	// Mismatch names the first wrong element when Correct is false.
	Mismatch string `json:"mismatch,omitempty"`
	// Error says why the all-reduce could not run.
	Error string `json:"error,omitempty"`
}

// Config is what Run needs. NVML is required; a nil function skips its checks.
type Config struct {
	NVML gpuinfo.NVML
	// NCCL finds NCCL (LoadNCCL does it for real).
	NCCL func() (NCCLInfo, error)
	// Smoke runs the smoke test on gpus; withNCCL says whether to
	// all-reduce too (Smoke does it for real).
	Smoke func(ctx context.Context, gpus []gpuinfo.Device, withNCCL bool) (*SmokeResult, error)
	// Probe starts a worker the way `gotrain launch` starts one for GPU gpu
	// among the node's GPUs listed in order (gpus, as launch lists them in
	// CUDA_VISIBLE_DEVICES) and returns the PCI bus id of the device the
	// worker got.
	Probe func(ctx context.Context, gpu int, gpus []int) (string, error)
	// Getenv reads the environment workers will inherit (default os.Getenv).
	Getenv func(string) string
	// MinNCCL is the oldest NCCL gotrain supports (default 2.18.0).
	MinNCCL nccl.Version
	// TempMarginC: a GPU within this many °C of its slowdown temperature
	// gets a warning (default 5).
	TempMarginC int
	// SelfPID is excluded from "other processes" (default os.Getpid()).
	SelfPID int
}

func (c *Config) setDefaults() {
	if c.Getenv == nil {
		c.Getenv = os.Getenv
	}
	if c.MinNCCL == 0 {
		c.MinNCCL = nccl.MakeVersion(2, 18, 0)
	}
	if c.TempMarginC == 0 {
		c.TempMarginC = 5
	}
	if c.SelfPID == 0 {
		c.SelfPID = os.Getpid()
	}
}

// Report is the result of Run. Its JSON form is `gotrain doctor --json`.
type Report struct {
	Healthy    bool   `json:"healthy"`
	Driver     string `json:"driver_version"`
	CUDADriver string `json:"cuda_driver_version"`
	NCCL       string `json:"nccl_version,omitempty"`
	// MultiRankGPU says whether several ranks may share a GPU: "enabled"
	// (NCCL ≥ 2.30 and NCCL_MULTI_RANK_GPU_ENABLE=1 here), "available"
	// (NCCL ≥ 2.30: gotrain launch --ranks-per-gpu N sets it), or
	// "unavailable" (an older NCCL).
	MultiRankGPU string         `json:"multi_rank_per_gpu,omitempty"`
	GPUs         []GPU          `json:"gpus"`
	Topology     *topo.Topology `json:"topology,omitempty"`
	Smoke        *SmokeResult   `json:"smoke,omitempty"`
	Checks       []Check        `json:"checks"`
}

func (r *Report) add(c Check) {
	r.Checks = append(r.Checks, c)
	if c.Status == Fail {
		r.Healthy = false
	}
}

// NoDriverFix is the fix of a node without a usable NVIDIA driver: install
// one, or train on CPU ranks, which need none.
const NoDriverFix = "install the NVIDIA driver (nvidia-smi must work); to train without GPUs, run the workers on CPU ranks: gotrain launch --backend cpu --nproc-per-node N -- PROGRAM"

// NoNVML is the report when NVML cannot be opened (no driver: err is a
// *gpuinfo.NoDriverError, or NVML fails to start): unhealthy, with one
// failed driver check that says why, so that `gotrain doctor --json` prints
// a report on every machine.
func NoNVML(err error) *Report {
	c := Check{Name: "driver", Status: Fail, Detail: "NVML does not start: " + err.Error(),
		Fix: "check that nvidia-smi works for this user; " + NoDriverFix[strings.Index(NoDriverFix, "to train without GPUs"):]}
	var nd *gpuinfo.NoDriverError
	if errors.As(err, &nd) {
		c.Detail, c.Fix = "no NVIDIA driver found ("+nd.Reason+")", NoDriverFix
	}
	rep := &Report{Healthy: true, GPUs: []GPU{}}
	rep.add(c)
	return rep
}

// Run runs every check and returns the report.
func Run(ctx context.Context, cfg Config) *Report {
	cfg.setDefaults()
	rep := &Report{Healthy: true, GPUs: []GPU{}}
	n := cfg.NVML

	// XID events are only reported from registration on: watch for them
	// while the other checks (and the smoke test) run.
	xw, xerr := n.WatchXID()

	count, err := n.Count()
	if err != nil {
		rep.add(Check{Name: "driver", Status: Fail, Detail: "NVML cannot count GPUs: " + err.Error(),
			Fix: "check that the NVIDIA driver is loaded (nvidia-smi), or reinstall it"})
		return rep
	}
	rep.Driver, _ = n.DriverVersion()
	if v, err := n.CUDADriverVersion(); err == nil {
		rep.CUDADriver = fmt.Sprintf("%d.%d", v/1000, v%1000/10)
	}
	if count == 0 {
		rep.add(Check{Name: "driver", Status: Fail, Detail: fmt.Sprintf("NVIDIA driver %s is loaded but shows no GPUs", rep.Driver),
			Fix: "check CUDA_VISIBLE_DEVICES/NVIDIA_VISIBLE_DEVICES and, in a container, that GPUs were passed in (docker run --gpus all)"})
		return rep
	}
	rep.add(Check{Name: "driver", Status: OK, Detail: fmt.Sprintf("NVIDIA driver %s (CUDA %s), %d GPU(s) visible", rep.Driver, rep.CUDADriver, count)})

	devs := make([]gpuinfo.Device, 0, count)
	for i := range count {
		g := GPU{}
		d, err := n.Device(i)
		if err != nil {
			rep.add(Check{Name: fmt.Sprintf("GPU%d", i), Status: Fail, Detail: err.Error(),
				Fix: "the GPU does not answer NVML: look for XID errors in dmesg and, if it persists, have the GPU reset or the node rebooted"})
			continue
		}
		g.Device = d
		s, err := n.Sample(i)
		if err != nil {
			rep.add(Check{Name: fmt.Sprintf("GPU%d", i), Status: Fail, Detail: "sample: " + err.Error(),
				Fix: "the GPU does not answer NVML: look for XID errors in dmesg"})
		}
		g.Sample = s
		g.Processes, _ = n.Processes(i)
		if g.Processes == nil {
			g.Processes = []gpuinfo.Process{}
		}
		rep.GPUs = append(rep.GPUs, g)
		devs = append(devs, d)
		rep.add(Check{Name: fmt.Sprintf("GPU%d", i), Status: OK, Detail: fmt.Sprintf("%s  %s  %s  memory %s / %s used",
			d.Name, d.UUID, d.PCIBusID, gib(s.MemoryUsed), gib(s.MemoryTotal))})
	}

	checkProcesses(rep, cfg.SelfPID)
	ncclOK := checkNCCL(rep, cfg)
	checkHealth(rep, cfg)
	checkPCIe(rep)

	if t, err := topo.Discover(n); err != nil {
		rep.add(Check{Name: "topology", Status: Warn, Detail: err.Error(), Fix: "run nvidia-smi topo -m to see what NVML reports"})
	} else {
		rep.Topology = t
		checkTopology(rep, t, cfg.Getenv)
	}

	if cfg.Smoke != nil {
		checkSmoke(ctx, rep, cfg, devs, ncclOK)
	}
	if cfg.Probe != nil {
		checkPlacement(ctx, rep, cfg, devs)
	}

	switch {
	case xerr != nil:
		rep.add(Check{Name: "xid", Status: Skip, Detail: "cannot watch XID events: " + xerr.Error(), Fix: "look for \"NVRM: Xid\" in dmesg"})
	default:
		xids, err := xw.Wait(10 * time.Millisecond)
		xw.Close()
		checkXID(rep, xids, err)
	}
	return rep
}

func gib(b uint64) string { return fmt.Sprintf("%.1f GiB", float64(b)/(1<<30)) }

func checkProcesses(rep *Report, self int) {
	var others []string
	for _, g := range rep.GPUs {
		for _, p := range g.Processes {
			if p.PID == self {
				continue
			}
			name := p.Name
			if name == "" {
				name = "?"
			}
			others = append(others, fmt.Sprintf("GPU%d: pid %d (%s) holds %s", g.Index, p.PID, name, gib(p.UsedMemory)))
		}
	}
	if len(others) == 0 {
		rep.add(Check{Name: "processes", Status: OK, Detail: "no other processes hold GPU memory"})
		return
	}
	rep.add(Check{Name: "processes", Status: Warn, Detail: strings.Join(others, "; "),
		Fix: "these processes compete for the GPUs' memory and time: stop them (or wait for them) before training, or pick other GPUs"})
}

// LoadNCCL finds NCCL as workers do (nccl.Load).
func LoadNCCL() (NCCLInfo, error) {
	l, err := nccl.Load()
	if err != nil {
		return NCCLInfo{}, err
	}
	return NCCLInfo{Path: l.Path(), Version: l.Version()}, nil
}

func checkNCCL(rep *Report, cfg Config) bool {
	if cfg.NCCL == nil {
		return false
	}
	info, err := cfg.NCCL()
	if err != nil {
		rep.add(Check{Name: "nccl", Status: Fail, Detail: err.Error(),
			Fix: "install NCCL (apt install libnccl2, or pip install nvidia-nccl-cu12/cu13) or point " + nccl.LibraryEnv + " at libnccl.so.2"})
		return false
	}
	rep.NCCL = info.Version.String()
	rep.MultiRankGPU = multiRankGPU(info.Version, os.Getenv("NCCL_MULTI_RANK_GPU_ENABLE"))
	if info.Version < cfg.MinNCCL {
		rep.add(Check{Name: "nccl", Status: Fail, Detail: fmt.Sprintf("NCCL %s at %s is older than %s", info.Version, info.Path, cfg.MinNCCL),
			Fix: "install NCCL " + cfg.MinNCCL.String() + " or newer built for CUDA " + rep.CUDADriver + " or older, or point " + nccl.LibraryEnv + " at one"})
		return false
	}
	// NCCL does not say which CUDA it was built for; the all-reduce of the
	// smoke test is what proves it runs on this driver.
	rep.add(Check{Name: "nccl", Status: OK, Detail: fmt.Sprintf("NCCL %s at %s (need ≥ %s; the smoke test's all-reduce shows it works with driver CUDA %s); multi-rank-per-GPU %s", info.Version, info.Path, cfg.MinNCCL, rep.CUDADriver, multiRankDetail[rep.MultiRankGPU])})
	return true
}

// MultiRankNCCL is the first NCCL that lets ranks of one communicator share
// a GPU (NCCL_MULTI_RANK_GPU_ENABLE, experimental).
var MultiRankNCCL = nccl.MakeVersion(2, 30, 0)

// multiRankGPU is Report.MultiRankGPU for NCCL v with the variable's value.
func multiRankGPU(v nccl.Version, enable string) string {
	switch {
	case v < MultiRankNCCL:
		return "unavailable"
	case enable == "1":
		return "enabled"
	}
	return "available"
}

var multiRankDetail = map[string]string{
	"unavailable": "unavailable (needs NCCL ≥ 2.30)",
	"enabled":     "enabled (NCCL_MULTI_RANK_GPU_ENABLE=1)",
	"available":   "available (gotrain launch --ranks-per-gpu N)",
}

func checkHealth(rep *Report, cfg Config) {
	var ecc, eccWarn, throttleFail, throttleWarn, temp, tempWarn, power []string
	for _, g := range rep.GPUs {
		s, id := g.Sample, fmt.Sprintf("GPU%d", g.Index)
		if s.ECCEnabled {
			if s.ECCUncorrected > 0 {
				ecc = append(ecc, fmt.Sprintf("%s: %d uncorrected", id, s.ECCUncorrected))
			}
			if s.ECCCorrected > 0 {
				eccWarn = append(eccWarn, fmt.Sprintf("%s: %d corrected", id, s.ECCCorrected))
			}
		}
		if bad := s.Throttle & (gpuinfo.ThrottleHarmful &^ gpuinfo.ThrottleSwPowerCap); bad != 0 {
			throttleFail = append(throttleFail, fmt.Sprintf("%s: %s", id, bad))
		} else if s.Throttle&gpuinfo.ThrottleSwPowerCap != 0 {
			throttleWarn = append(throttleWarn, fmt.Sprintf("%s: sw_power_cap", id))
		}
		if s.TempC >= 0 && s.SlowdownTempC > 0 {
			switch {
			case s.TempC >= s.SlowdownTempC:
				temp = append(temp, fmt.Sprintf("%s at %d °C, slows down at %d °C", id, s.TempC, s.SlowdownTempC))
			case s.TempC >= s.SlowdownTempC-cfg.TempMarginC:
				tempWarn = append(tempWarn, fmt.Sprintf("%s at %d °C, slows down at %d °C", id, s.TempC, s.SlowdownTempC))
			}
		}
		if s.PowerW >= 0 && s.PowerLimitW > 0 && s.PowerW >= 0.98*s.PowerLimitW {
			power = append(power, fmt.Sprintf("%s draws %.0f W of its %.0f W limit", id, s.PowerW, s.PowerLimitW))
		}
	}
	switch {
	case len(ecc) > 0:
		rep.add(Check{Name: "ecc", Status: Fail, Detail: strings.Join(append(ecc, eccWarn...), "; "),
			Fix: "uncorrected ECC errors corrupt results: drain the node, have the GPU reset (retires the bad pages), and replace it if they return"})
	case len(eccWarn) > 0:
		rep.add(Check{Name: "ecc", Status: Warn, Detail: strings.Join(eccWarn, "; "),
			Fix: "corrected errors are harmless one by one; a growing count means failing memory: watch nvidia-smi -q -d ECC"})
	default:
		rep.add(Check{Name: "ecc", Status: OK, Detail: "no ECC errors since the driver loaded" + eccNote(rep)})
	}
	switch {
	case len(throttleFail) > 0:
		rep.add(Check{Name: "throttle", Status: Fail, Detail: strings.Join(throttleFail, "; "),
			Fix: "the GPU slows itself down for heat or power: check cooling and airflow, the PSU and power cables (nvidia-smi -q -d PERFORMANCE shows the reasons)"})
	case len(throttleWarn) > 0:
		rep.add(Check{Name: "throttle", Status: Warn, Detail: strings.Join(throttleWarn, "; "),
			Fix: "the GPU is at its software power cap: expected under full load, suspicious when idle (check the power limit with nvidia-smi -q -d POWER)"})
	default:
		rep.add(Check{Name: "throttle", Status: OK, Detail: "no thermal or power throttling"})
	}
	switch {
	case len(temp) > 0:
		rep.add(Check{Name: "temperature", Status: Fail, Detail: strings.Join(append(temp, tempWarn...), "; "),
			Fix: "the GPU is at its slowdown temperature: check its cooling (fans, airflow, the data-centre inlet temperature)"})
	case len(tempWarn) > 0:
		rep.add(Check{Name: "temperature", Status: Warn, Detail: strings.Join(tempWarn, "; "),
			Fix: "the GPU runs close to its slowdown temperature: check cooling before a long job"})
	default:
		rep.add(Check{Name: "temperature", Status: OK, Detail: tempSummary(rep)})
	}
	if len(power) > 0 {
		rep.add(Check{Name: "power", Status: Warn, Detail: strings.Join(power, "; "),
			Fix: "the GPU is at its power limit; if nothing else runs on it, something does (see processes)"})
	} else {
		rep.add(Check{Name: "power", Status: OK, Detail: powerSummary(rep)})
	}
}

// checkPCIe compares each GPU's PCIe link with its maximum: a link
// trained at fewer lanes (a loose riser, a bad slot) halves or worse every
// host↔device copy, on every step. A lower generation alone is only a
// warning: an idle GPU lowers it to save power.
func checkPCIe(rep *Report) {
	var narrow, slow []string
	known := 0
	for _, g := range rep.GPUs {
		s, id := g.Sample, fmt.Sprintf("GPU%d", g.Index)
		if s.PCIeWidth == 0 || s.PCIeMaxWidth == 0 {
			continue
		}
		known++
		if s.PCIeWidth < s.PCIeMaxWidth {
			narrow = append(narrow, fmt.Sprintf("%s: x%d of x%d", id, s.PCIeWidth, s.PCIeMaxWidth))
		}
		if s.PCIeGen > 0 && s.PCIeGen < s.PCIeMaxGen {
			slow = append(slow, fmt.Sprintf("%s: gen %d of %d", id, s.PCIeGen, s.PCIeMaxGen))
		}
	}
	switch {
	case known == 0:
		rep.add(Check{Name: "pcie", Status: Skip, Detail: "NVML does not report the PCIe link here"})
	case len(narrow) > 0:
		rep.add(Check{Name: "pcie", Status: Fail, Detail: "link narrower than the device's maximum: " + strings.Join(narrow, "; "),
			Fix: "reseat the GPU or its riser, or move it to a full-width slot; nvidia-smi -q -d PCIE shows the link"})
	case len(slow) > 0:
		rep.add(Check{Name: "pcie", Status: Warn, Detail: "link below its maximum generation: " + strings.Join(slow, "; "),
			Fix: "normal for an idle GPU (it lowers the generation to save power); under load, check the slot's BIOS setting and the riser"})
	default:
		rep.add(Check{Name: "pcie", Status: OK, Detail: fmt.Sprintf("every link at its maximum width (%d GPUs)", known)})
	}
}

func eccNote(rep *Report) string {
	off := 0
	for _, g := range rep.GPUs {
		if !g.Sample.ECCEnabled {
			off++
		}
	}
	if off > 0 {
		return fmt.Sprintf(" (ECC is off or unsupported on %d GPU(s))", off)
	}
	return ""
}

func tempSummary(rep *Report) string {
	return perGPU(rep, "temperature not reported", func(g GPU) (string, bool) {
		return fmt.Sprintf("GPU%d %d °C (slowdown %d °C)", g.Index, g.Sample.TempC, g.Sample.SlowdownTempC), g.Sample.TempC >= 0
	})
}

func powerSummary(rep *Report) string {
	return perGPU(rep, "power not reported", func(g GPU) (string, bool) {
		return fmt.Sprintf("GPU%d %.0f W / %.0f W", g.Index, g.Sample.PowerW, g.Sample.PowerLimitW), g.Sample.PowerW >= 0
	})
}

// perGPU joins what part says of each GPU that reports it, or returns none
// when no GPU does.
func perGPU(rep *Report, none string, part func(GPU) (string, bool)) string {
	var parts []string
	for _, g := range rep.GPUs {
		if p, ok := part(g); ok {
			parts = append(parts, p)
		}
	}
	if len(parts) == 0 {
		return none
	}
	return strings.Join(parts, ", ")
}

func checkTopology(rep *Report, t *topo.Topology, getenv func(string) string) {
	all := make([]int, len(t.GPUs))
	for i := range all {
		all[i] = i
	}
	var pairs []string
	for i := range t.GPUs {
		for j := i + 1; j < len(t.GPUs); j++ {
			pairs = append(pairs, fmt.Sprintf("GPU%d-GPU%d %s", i, j, t.Links[i][j]))
		}
	}
	detail := strings.Join(pairs, ", ")
	if len(pairs) > 8 {
		detail = summarizeLinks(t)
	}
	if detail == "" {
		detail = "one GPU"
	}
	if ws := t.Warnings(all, getenv); len(ws) > 0 {
		rep.add(Check{Name: "topology", Status: Warn, Detail: detail + "; " + strings.Join(ws, "; "),
			Fix: "launch on GPUs that share NVLink or a NUMA node (gotrain topo shows them), and leave NCCL_P2P_DISABLE unset"})
		return
	}
	rep.add(Check{Name: "topology", Status: OK, Detail: detail})
}

// summarizeLinks counts the kinds of links: "28 pairs NV18".
func summarizeLinks(t *topo.Topology) string {
	counts := map[string]int{}
	var kinds []string
	for i := range t.GPUs {
		for j := i + 1; j < len(t.GPUs); j++ {
			k := t.Links[i][j].String()
			if counts[k] == 0 {
				kinds = append(kinds, k)
			}
			counts[k]++
		}
	}
	var parts []string
	for _, k := range kinds {
		parts = append(parts, fmt.Sprintf("%d pairs %s", counts[k], k))
	}
	return strings.Join(parts, ", ")
}

func checkSmoke(ctx context.Context, rep *Report, cfg Config, devs []gpuinfo.Device, withNCCL bool) {
	res, err := cfg.Smoke(ctx, devs, withNCCL)
	if err != nil {
		rep.add(Check{Name: "smoke kernel", Status: Fail, Detail: err.Error(),
			Fix: "CUDA cannot use the GPUs: check that libcuda.so.1 matches the driver (same version as nvidia-smi's), and that no other process holds the GPUs in exclusive mode"})
		return
	}
	rep.Smoke = res
	var bad []string
	for _, g := range res.GPUs {
		if !g.OK {
			bad = append(bad, fmt.Sprintf("GPU%d: %s", g.Index, g.Error))
		}
	}
	if len(bad) > 0 {
		rep.add(Check{Name: "smoke kernel", Status: Fail, Detail: strings.Join(bad, "; "),
			Fix: "a GPU failed to allocate, run a kernel or compute right: free its memory (see processes), look for XID errors in dmesg, and have it reset if they persist"})
	} else {
		rep.add(Check{Name: "smoke kernel", Status: OK, Detail: fmt.Sprintf("allocated, ran a kernel and checked its result on %d GPU(s)", len(res.GPUs))})
	}
	ar := res.AllReduce
	switch {
	case !withNCCL:
		rep.add(Check{Name: "smoke all-reduce", Status: Skip, Detail: "no usable NCCL", Fix: "see the nccl check"})
	case ar == nil:
		rep.add(Check{Name: "smoke all-reduce", Status: Skip, Detail: "not run"})
	case ar.Error != "":
		rep.add(Check{Name: "smoke all-reduce", Status: Fail, Detail: ar.Error,
			Fix: "rerun with NCCL_DEBUG=INFO to see which transport fails; check NCCL_P2P_DISABLE, NCCL_SHM_DISABLE and that /dev/shm is large enough"})
	case !ar.Correct:
		rep.add(Check{Name: "smoke all-reduce", Status: Fail, Detail: fmt.Sprintf("all-reduce of %s across %d GPUs gave wrong results: %s", byteSize(ar.Bytes), ar.GPUs, ar.Mismatch),
			Fix: "NCCL computed wrong sums: check ECC and XID errors, and try NCCL_P2P_DISABLE=1 to rule out a broken peer-to-peer path"})
	default:
		rep.add(Check{Name: "smoke all-reduce", Status: OK, Detail: fmt.Sprintf("all-reduce of %s float32 across %d GPU(s): %.0f µs, algbw %.1f GB/s, busbw %.1f GB/s",
			byteSize(ar.Bytes), ar.GPUs, float64(ar.Time)/float64(time.Microsecond), ar.AlgBW, ar.BusBW)})
	}
	checkPeers(rep, res.Peers)
}

// checkPeers says whether two-rank jobs can average gradients over the
// copy engines (worker/pairreduce) on every pair of GPUs.
func checkPeers(rep *Report, peers []PeerAccess) {
	if len(peers) == 0 {
		rep.add(Check{Name: "peer access", Status: Skip, Detail: "fewer than two GPUs tested"})
		return
	}
	var bad []string
	for _, p := range peers {
		if !p.OK {
			why := "no peer-to-peer path"
			if p.Error != "" {
				why = p.Error
			}
			bad = append(bad, fmt.Sprintf("GPU%d↔GPU%d: %s", p.A, p.B, why))
		}
	}
	if len(bad) > 0 {
		rep.add(Check{Name: "peer access", Status: Warn, Detail: strings.Join(bad, "; "),
			Fix: "DataParallel falls back to NCCL for two ranks on these GPUs (slower beside compute); peer access needs NVLink or PCIe P2P enabled (IOMMU/ACS settings, nvidia-smi topo -p2p r)"})
		return
	}
	rep.add(Check{Name: "peer access", Status: OK, Detail: fmt.Sprintf("every GPU pair (%d) maps each other's memory: two-rank jobs on them average gradients over the copy engines", len(peers))})
}

func byteSize(b int) string {
	switch {
	case b >= 1<<30 && b%(1<<30) == 0:
		return fmt.Sprintf("%d GiB", b>>30)
	case b >= 1<<20:
		return fmt.Sprintf("%d MiB", b>>20)
	}
	return fmt.Sprintf("%d B", b)
}

func checkPlacement(ctx context.Context, rep *Report, cfg Config, devs []gpuinfo.Device) {
	var bad, good []string
	// The node's GPUs listed last to first, so that a GPU's position in the
	// list differs from its index and both the ordering and the lookup by
	// position are checked.
	var order []int
	for i := len(devs) - 1; i >= 0; i-- {
		order = append(order, devs[i].Index)
	}
	for _, d := range devs {
		got, err := cfg.Probe(ctx, d.Index, order)
		switch {
		case err != nil:
			bad = append(bad, fmt.Sprintf("GPU%d: worker probe failed: %v", d.Index, err))
		case gpuinfo.BusIDKey(got) != gpuinfo.BusIDKey(d.PCIBusID):
			bad = append(bad, fmt.Sprintf("GPU%d (%s): the worker got the device at %s", d.Index, d.PCIBusID, got))
		default:
			good = append(good, fmt.Sprintf("GPU%d→%s", d.Index, gpuinfo.BusIDKey(got)))
		}
	}
	if len(bad) > 0 {
		rep.add(Check{Name: "worker placement", Status: Fail, Detail: strings.Join(bad, "; "),
			Fix: "workers would run on the wrong GPU: unset CUDA_VISIBLE_DEVICES and CUDA_DEVICE_ORDER before gotrain launch (gotrain sets both per worker)"})
		return
	}
	rep.add(Check{Name: "worker placement", Status: OK, Detail: "each worker gets the GPU it is given: " + strings.Join(good, ", ")})
}

func checkXID(rep *Report, xids []gpuinfo.XID, err error) {
	if err != nil {
		rep.add(Check{Name: "xid", Status: Skip, Detail: "cannot read XID events: " + err.Error(), Fix: "look for \"NVRM: Xid\" in dmesg"})
		return
	}
	if len(xids) == 0 {
		rep.add(Check{Name: "xid", Status: OK, Detail: "no XID errors while doctor ran (NVML reports only new ones; dmesg has older ones)"})
		return
	}
	var parts []string
	for _, x := range xids {
		parts = append(parts, fmt.Sprintf("GPU%d: XID %d", x.GPU, x.Code))
	}
	rep.add(Check{Name: "xid", Status: Fail, Detail: strings.Join(parts, "; "),
		Fix: "the driver reported GPU errors: look them up in NVIDIA's XID catalogue (dmesg shows details); 48/63/64/92/94/95 are memory errors, 79 means the GPU fell off the bus, 74 an NVLink error"})
}

// WriteText prints the report for a person: one line per check, its fix
// below a check that is not ok, the topology matrix, and a verdict.
func (r *Report) WriteText(w io.Writer) error {
	var b strings.Builder
	for _, c := range r.Checks {
		label := map[Status]string{OK: "ok", Warn: "WARN", Fail: "FAIL", Skip: "skip"}[c.Status]
		fmt.Fprintf(&b, "%-5s %-17s %s\n", label, c.Name, c.Detail)
		if c.Status != OK && c.Fix != "" {
			fmt.Fprintf(&b, "      %-17s fix: %s\n", "", c.Fix)
		}
	}
	if r.Topology != nil && len(r.Topology.GPUs) > 1 {
		b.WriteString("\n")
		var m strings.Builder
		if err := r.Topology.WriteMatrix(&m); err == nil {
			// The matrix without its legend; `gotrain topo` has it.
			mat, _, _ := strings.Cut(m.String(), "\nLegend:")
			b.WriteString(mat)
		}
	}
	fails, warns := 0, 0
	for _, c := range r.Checks {
		switch c.Status {
		case Fail:
			fails++
		case Warn:
			warns++
		}
	}
	b.WriteString("\n")
	switch {
	case fails > 0:
		fmt.Fprintf(&b, "gotrain doctor: %d check(s) failed, %d warning(s): fix the FAIL lines above\n", fails, warns)
	case warns > 0:
		fmt.Fprintf(&b, "gotrain doctor: all checks passed, %d warning(s)\n", warns)
	default:
		b.WriteString("gotrain doctor: all checks passed\n")
	}
	_, err := io.WriteString(w, b.String())
	return err
}
