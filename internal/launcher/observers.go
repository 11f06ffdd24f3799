package launcher

import (
	"context"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/gotrain/gotrain/internal/gpu/gpuinfo"
	"github.com/gotrain/gotrain/internal/launcher/observe"
	gotrainv1 "github.com/gotrain/gotrain/proto/gotrain/v1"
)

// The agent's observers (package observe), started with its other
// subsystems once the hub exists: they annotate the ranks' progress that
// the hub reports.

// openNVML is gpuinfo.Open; tests replace it with a fake.
var openNVML = gpuinfo.Open

// installTorchHook writes the hook into pyDir and makes its records
// directory in dir; nil (no view) when it cannot.
func (a *agent) installTorchHook(pyDir, dir string) *observe.TorchProgress {
	tp, err := observe.InstallTorchHook(pyDir, dir)
	if err != nil {
		a.log.Warn("no collective-level view of PyTorch ranks on gloo: their hangs are judged by process state only", "err", err)
		return nil
	}
	return tp
}

// startRASPoll starts reading NCCL RAS on NCCL jobs; called once the hub
// exists.
func (a *agent) startRASPoll(ctx context.Context, g *errgroup.Group) {
	if a.cfg.Backend != "nccl" || a.hub == nil {
		return
	}
	p := observe.NewRASPoller(a.log.With("component", "nccl-ras"), a.hub, a.cfg.Env)
	a.hub.SetRAS(p)
	g.Go(func() error { p.Run(ctx); return nil })
}

// startGPUSampling turns GPU sampling on when NVML is there: the hub's
// telemetry gets a sampler of the GPUs of this node's ranks. Without a
// driver it stays off.
func (a *agent) startGPUSampling(ctx context.Context, g *errgroup.Group) {
	tel := observe.NewTelemetry(time.Now)
	a.hub.SetTelemetry(tel)
	nv, err := openNVML()
	if err != nil {
		a.log.Info("GPU sampling off", "err", err)
		return
	}
	tel.GPUs = observe.NewGPUSampler(nv, a.host, time.Now, a.log, func(msg string) {
		a.stderr.WriteLine("gotrain: warning: ", []byte(msg))
		a.log.Info("GPU warning", "msg", msg)
	}, a.hub.RankOfGPU)
	g.Go(func() error {
		defer nv.Close()
		tel.GPUs.Run(ctx, a.hub.UsedGPUs)
		return nil
	})
}

// recordRootCause writes the job's end into the run's log dir, when there
// is one: a failure's root cause, or that it succeeded, so that the file
// there always says how this run ended (a run never sees another's: each
// has its own directory, output/logdir.go).
func (a *agent) recordRootCause(f *gotrainv1.JobFinished) {
	if a.cfg.LogDir == "" {
		return
	}
	if err := observe.RecordRootCause(a.cfg.LogDir, a.cfg.RunID, f, exitCodeOf(f), a.gen, a.recov.done); err != nil {
		a.logTrouble.Warn(err)
	}
}
