// Recover is the smallest training program that survives a rank's death
// without losing a step: it trains inside worker.Run, so the ranks that
// live on keep their state in memory and recover in process, and it
// restores in the two ways a gotrain program does:
//
//   - Generation.Restore, when ranks survived the previous generation
//     (g.Source ≥ 0): the lowest survivor broadcasts its live state to the
//     restarted processes;
//   - worker.Restore, when every process is new (the job's first
//     generation, or all ranks restarted): the newest state any rank finds
//     in its agent's memory (--snapshots), a peer agent's copy or the disk
//     checkpoint (--checkpoint-dir), agreed across the ranks.
//
// The model is a line, y = w·x + b, fitted to y = 3x + 1 plus noise by
// data-parallel SGD with momentum: every rank draws its own batch from
// (--seed, rank, step), the gradients are averaged with one all-reduce, and
// every rank applies the same update, so the ranks stay bitwise equal and a
// resumed run ends with the weights of one that never stopped.
//
// # Usage
//
//	gotrain launch --nproc-per-node 2 --backend cpu --max-restarts 1 -- \
//	    recover --steps 200 --checkpoint-dir /tmp/ckpt --snapshots
//
//	# rank 1 exits at step 100 on the first attempt; rank 0 survives:
//	gotrain launch --nproc-per-node 2 --backend cpu --max-restarts 1 -- \
//	    recover --steps 200 --die-at-step 100 --die-rank 1
//
// Rank 0 ends with "done step=N w=… b=…" (w and b in hexadecimal floats,
// exact), every rank with "rank R agrees" once the ranks compared weights.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/signal"
	"syscall"

	"github.com/gotrain/gotrain/worker"
	"github.com/gotrain/gotrain/worker/checkpoint"
)

// config is one run's settings; main fills it from flags.
type config struct {
	Steps, Batch       int
	LR, Momentum       float64
	Seed               uint64
	CheckpointDir      string
	CheckpointEvery    int
	Snapshots          bool
	DieAtStep, DieRank int
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintf(os.Stderr, "recover: %v\n", err)
		}
		os.Exit(2)
	}
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cfg, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	w, err := worker.Init(ctx)
	if err != nil {
		return err // it says how to start the program under gotrain
	}
	defer w.Close()
	var snaps *worker.Snapshots
	if cfg.Snapshots {
		if snaps, err = w.Snapshots(ctx); err != nil {
			return err // it names the rank
		}
		defer snaps.Close()
	}
	disk := checkpoint.Dir{Path: cfg.CheckpointDir}

	// The training state lives outside train, so that a survivor keeps it
	// across generations: the step (as the header), then w, b and their
	// velocities.
	step := []int64{0}
	params := []float64{0, 0, 0, 0}
	state := []worker.Buffer{worker.Host(step), worker.Host(params)}

	return w.Run(ctx, "recover", func(ctx context.Context, g *worker.Generation) error {
		if g.Source >= 0 {
			if err := g.Restore(ctx, state...); err != nil {
				return err // it names the source rank
			}
			fmt.Fprintf(stdout, "generation %d: restored step %d from surviving rank %d\n", g.Number, step[0], g.Source)
		} else {
			r, err := worker.Restore(ctx, g.Comm, worker.Tiers{Snapshots: snaps, Disk: disk}, state...)
			switch {
			case errors.Is(err, worker.ErrNoState):
				fmt.Fprintf(stdout, "generation %d: a fresh start\n", g.Number)
			case err != nil:
				return err // it names the rank and the cause
			default:
				fmt.Fprintf(stdout, "generation %d: restored step %d from %s of rank %d\n", g.Number, r.Step, r.Source, r.Rank)
			}
		}
		return train(ctx, g, cfg, step, params, snaps, disk, stdout)
	})
}

// train takes steps from step[0] to cfg.Steps.
func train(ctx context.Context, g *worker.Generation, cfg config, step []int64, p []float64, snaps *worker.Snapshots, disk checkpoint.Dir, stdout io.Writer) error {
	grad := []float64{0, 0}
	for ; step[0] < int64(cfg.Steps); step[0]++ {
		rng := rand.New(rand.NewPCG(cfg.Seed, uint64(g.Rank)<<32|uint64(step[0])))
		grad[0], grad[1] = 0, 0
		for range cfg.Batch {
			x := rng.Float64()*2 - 1
			y := 3*x + 1 + 0.1*rng.NormFloat64()
			e := p[0]*x + p[1] - y
			grad[0] += e * x / float64(cfg.Batch)
			grad[1] += e / float64(cfg.Batch)
		}
		if err := g.Comm.AllReduce(ctx, worker.Host(grad), worker.Host(grad), worker.Avg); err != nil {
			return fmt.Errorf("rank %d: step %d: average the gradients: %w", g.Rank, step[0], err)
		}
		for i := range 2 {
			p[2+i] = cfg.Momentum*p[2+i] + grad[i]
			p[i] -= cfg.LR * p[2+i]
		}
		done := step[0] + 1
		if snaps != nil {
			snaps.Save(done, worker.Host([]int64{done}), worker.Host(p))
		}
		if disk.Path != "" && g.Rank == 0 && cfg.CheckpointEvery > 0 && done%int64(cfg.CheckpointEvery) == 0 {
			if err := disk.Save(done, stateBytes(done, p)); err != nil {
				return fmt.Errorf("rank 0: checkpoint of step %d: %w", done, err)
			}
		}
		if done == int64(cfg.DieAtStep) && g.Rank == cfg.DieRank && g.RestartCount == 0 {
			if snaps != nil {
				_ = snaps.Wait(ctx) // this step's snapshot is in the agent's memory before the death
			}
			fmt.Fprintf(stdout, "rank %d dies on purpose at step %d\n", g.Rank, done)
			os.Exit(3)
		}
	}
	return agree(ctx, g, step[0], p, stdout)
}

// stateBytes is the state as Restore's buffers lay it out: the step, then
// the parameters (little-endian, as in memory on every machine gotrain runs
// on).
func stateBytes(step int64, p []float64) []byte {
	return append(worker.Host([]int64{step}).HostBytes(), worker.Host(p).HostBytes()...)
}

// agree checks that every rank holds rank 0's weights, bit for bit.
func agree(ctx context.Context, g *worker.Generation, step int64, p []float64, stdout io.Writer) error {
	mine := append([]float64(nil), p...)
	if err := g.Comm.Broadcast(ctx, worker.Host(p), 0); err != nil {
		return fmt.Errorf("rank %d: compare the weights: %w", g.Rank, err)
	}
	for i := range p {
		if p[i] != mine[i] {
			return fmt.Errorf("rank %d: weights %v differ from rank 0's %v: the ranks did not start from one state", g.Rank, mine, p)
		}
	}
	fmt.Fprintf(stdout, "rank %d agrees\n", g.Rank)
	if g.Rank == 0 {
		fmt.Fprintf(stdout, "done step=%d w=%x b=%x\n", step, p[0], p[1])
	}
	return nil
}

func parseFlags(args []string, stderr io.Writer) (config, error) {
	cfg := config{Steps: 200, Batch: 16, LR: 0.05, Momentum: 0.9, Seed: 1}
	fs := flag.NewFlagSet("recover", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, `Usage: gotrain launch [launch flags] -- recover [flags]

Fits a line by data-parallel SGD inside worker.Run; restores from surviving
ranks (Generation.Restore) or the newest state any rank finds
(worker.Restore: agent memory, a peer's copy, the disk checkpoint).

Examples:
  gotrain launch --nproc-per-node 2 --backend cpu --max-restarts 1 -- recover --checkpoint-dir /tmp/ckpt --checkpoint-every 20
  gotrain launch --nproc-per-node 2 --backend cpu --max-restarts 1 -- recover --snapshots --die-at-step 100 --die-rank 1

Flags:
`)
		fs.PrintDefaults()
	}
	fs.IntVar(&cfg.Steps, "steps", cfg.Steps, "training steps")
	fs.IntVar(&cfg.Batch, "batch-size", cfg.Batch, "examples per rank per step")
	fs.Float64Var(&cfg.LR, "lr", cfg.LR, "learning rate")
	fs.Float64Var(&cfg.Momentum, "momentum", cfg.Momentum, "SGD momentum")
	fs.Uint64Var(&cfg.Seed, "seed", cfg.Seed, "seed of the data")
	fs.StringVar(&cfg.CheckpointDir, "checkpoint-dir", "", "`dir`ectory for checkpoints (rank 0 writes every --checkpoint-every steps); a new job resumes from the newest valid one")
	fs.IntVar(&cfg.CheckpointEvery, "checkpoint-every", 20, "checkpoint every `n` steps (with --checkpoint-dir)")
	fs.BoolVar(&cfg.Snapshots, "snapshots", false, "hand the state to the agent's memory after every step (worker.Snapshots)")
	fs.IntVar(&cfg.DieAtStep, "die-at-step", 0, "fault injection: rank --die-rank exits after step `n` on the job's first attempt")
	fs.IntVar(&cfg.DieRank, "die-rank", 0, "the `rank` --die-at-step ends")
	if err := fs.Parse(args); err != nil {
		return config{}, err
	}
	var errs []error
	if fs.NArg() > 0 {
		errs = append(errs, fmt.Errorf("unexpected arguments %q", fs.Args()))
	}
	if cfg.Steps < 1 || cfg.Batch < 1 {
		errs = append(errs, fmt.Errorf("--steps %d and --batch-size %d must be at least 1", cfg.Steps, cfg.Batch))
	}
	if !(cfg.LR > 0) || cfg.Momentum < 0 || cfg.Momentum >= 1 {
		errs = append(errs, fmt.Errorf("--lr %g must be above 0 and --momentum %g in [0, 1)", cfg.LR, cfg.Momentum))
	}
	if cfg.CheckpointEvery < 1 {
		errs = append(errs, fmt.Errorf("--checkpoint-every %d must be at least 1", cfg.CheckpointEvery))
	}
	if err := errors.Join(errs...); err != nil {
		return config{}, fmt.Errorf("%w (see --help)", err)
	}
	return cfg, nil
}
