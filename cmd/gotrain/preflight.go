package main

import (
	"context"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/gotrain/gotrain/cmd/gotrain/internal/doctor"
	"github.com/gotrain/gotrain/internal/gpu/gpuinfo"
	"github.com/gotrain/gotrain/internal/launcher"
	"github.com/gotrain/gotrain/internal/nodehealth"
	"github.com/gotrain/gotrain/internal/preflight"
)

// preflightLevel decides --preflight's level: the one given, else quick for
// a multi-node GPU job (where a bad node costs the most) and off for the
// rest. note is the line a one-node GPU job prints once, saying how to ask.
func preflightLevel(given string, nodes int, backend string) (level preflight.Level, note string, err error) {
	if given != "" {
		level, err = preflight.ParseLevel(given)
		return level, "", err
	}
	switch {
	case nodes > 1 && backend == "nccl":
		return preflight.Quick, "", nil
	case backend == "nccl":
		return preflight.Off, "gotrain: no preflight check on one node (--preflight quick proves the driver, the GPUs and torch against them in a few seconds first)", nil
	}
	return preflight.Off, "", nil
}

// setUpPreflight sets cfg.Preflight from --preflight (preflightFlag: "" if
// not given), printing the one-node note when there is one.
func setUpPreflight(cfg *launcher.Config, given string, slurm bool) error {
	level, note, err := preflightLevel(given, cfg.Nodes, cfg.Backend)
	if err != nil {
		return &usageError{msg: err.Error(), hint: "Use --preflight quick, --preflight full or --preflight off."}
	}
	if note != "" {
		fmt.Fprintln(os.Stderr, note)
	}
	if level == preflight.Off {
		return nil
	}
	p := &launcher.Preflight{Level: level, Slurm: slurm, Policy: nodehealth.DefaultPolicy, Run: preflightRunner(level, cfg.Backend, cfg.NprocPerNode)}
	if path := nodehealth.DefaultPath(os.Getenv); path != "" {
		p.Ledger = nodehealth.Open(path)
	}
	cfg.Preflight = p
	return nil
}

// preflightRunner measures a node of a job on backend at level: the CPU
// backend's all-reduce gate on CPU jobs; doctor's GPU checks, the
// framework check (Python programs) and, at full, doctor's smoke test with
// its NCCL all-reduce, side by side, on GPU jobs.
func preflightRunner(level preflight.Level, backend string, nproc int) func(ctx context.Context, python string, env []string) ([]preflight.Figure, error) {
	return func(ctx context.Context, python string, env []string) ([]preflight.Figure, error) {
		if backend == "cpu" {
			gate := preflight.QuickCPU
			if level == preflight.Full {
				gate = preflight.FullCPU
			}
			return preflight.CPUGate(ctx, gate)
		}
		n, err := gpuinfo.Open()
		if err != nil {
			return doctorFigures(doctor.NoNVML(err), level), nil
		}
		defer n.Close()
		// The framework check imports torch (seconds): it runs beside
		// doctor's checks, not after them.
		var fw preflight.FrameworkReport
		var fwErr error
		var wg sync.WaitGroup
		if python != "" {
			wg.Go(func() {
				fw, fwErr = preflight.RunFramework(ctx, preflight.FrameworkConfig{Python: python, Env: env, Timeout: 2 * time.Minute, CopyMiB: copyMiB(level)})
			})
		}
		cfg := doctor.Config{NVML: n, NCCL: doctor.LoadNCCL}
		if level == preflight.Full {
			cfg.Smoke = doctor.Smoke
		}
		rep := doctor.Run(ctx, cfg)
		figs := doctorFigures(rep, level)
		wg.Wait()
		if python == "" {
			return figs, nil
		}
		if fwErr != nil {
			return append(figs, preflight.Figure{Check: preflight.CheckFramework, Failed: true, Detail: fwErr.Error()}), nil
		}
		// torch must see as many GPUs as the node's workers use (the
		// user may hide the rest with CUDA_VISIBLE_DEVICES).
		figs = append(figs, preflight.FrameworkFigures(fw, min(len(rep.GPUs), nproc), rep.CUDADriver)...)
		return append(figs, preflight.CopyFigures(fw, h2dFloor(rep))...), nil
	}
}

// copyMiB is the size of the framework check's pinned copies per GPU at
// level: a few milliseconds each on a healthy link.
func copyMiB(level preflight.Level) int {
	if level == preflight.Full {
		return 512
	}
	return 64
}

// h2dFloor is the copy rate every GPU of the node should reach: the floor
// of the weakest link's maximum (torch's GPU order need not be NVML's,
// and a link trained below its maximum is the pcie check's to name).
func h2dFloor(rep *doctor.Report) float64 {
	floor := 0.0
	for _, g := range rep.GPUs {
		f := preflight.H2DFloor(g.Sample.PCIeMaxGen, g.Sample.PCIeMaxWidth)
		if floor == 0 || f < floor {
			floor = f
		}
	}
	if floor == 0 {
		return preflight.H2DFloor(0, 0)
	}
	return floor
}

// doctorCheck maps doctor's check names to preflight's.
var doctorCheck = map[string]preflight.Check{
	"driver":      preflight.CheckDriver,
	"ecc":         preflight.CheckHealth,
	"xid":         preflight.CheckHealth,
	"throttle":    preflight.CheckHealth,
	"temperature": preflight.CheckHealth,
	"pcie":        preflight.CheckPCIe,
}

// doctorFigures turns doctor's report into figures: its failed checks of
// the kinds preflight judges, and at full level the NCCL all-reduce's bus
// bandwidth against the topology's expectation.
func doctorFigures(rep *doctor.Report, level preflight.Level) []preflight.Figure {
	var figs []preflight.Figure
	for _, c := range rep.Checks {
		check, ok := doctorCheck[c.Name]
		if !ok {
			continue
		}
		figs = append(figs, preflight.Figure{Check: check, Subject: c.Name, Failed: c.Status == doctor.Fail, Detail: c.Detail, Fix: c.Fix})
	}
	if ar := rep.Smoke; level == preflight.Full && ar != nil && ar.AllReduce != nil && ar.AllReduce.Error == "" {
		nvlink := rep.Topology != nil && hasNVLink(rep)
		figs = append(figs, preflight.Figure{Check: preflight.CheckNCCL, Measured: ar.AllReduce.BusBW, Want: preflight.NCCLBusBWFloor(nvlink), Unit: "GB/s",
			Detail: fmt.Sprintf("%d GPUs, %d MiB", ar.AllReduce.GPUs, ar.AllReduce.Bytes>>20)})
	}
	return figs
}

// hasNVLink says whether any GPU of the report has an active NVLink.
func hasNVLink(rep *doctor.Report) bool {
	for _, g := range rep.Topology.GPUs {
		if g.ActiveNVLinks > 0 {
			return true
		}
	}
	return false
}
