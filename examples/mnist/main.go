package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/gotrain/gotrain/examples/internal/mnistdata"

	"github.com/gotrain/gotrain/worker"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	switch {
	case errors.Is(err, flag.ErrHelp):
	case err != nil:
		fmt.Fprintln(os.Stderr, "mnist:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cfg, dataDir, snapshots, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	w, err := worker.Init(ctx, worker.WithLogger(slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))))
	if errors.Is(err, worker.ErrNotLaunched) {
		return fmt.Errorf("%w\n\tfor example: bin/gotrain launch --nproc-per-node 4 --backend cpu -- bin/mnist", err)
	}
	if err != nil {
		return err
	}
	defer w.Close()

	if dataDir == "" {
		if dataDir, err = mnistdata.DefaultDir(); err != nil {
			return fmt.Errorf("rank %d: %w", w.Rank, err)
		}
	}
	ds, err := mnistdata.Load(dataDir)
	if err != nil {
		return fmt.Errorf("rank %d: %w", w.Rank, err)
	}
	c, err := w.NewComm(ctx, "mnist")
	if err != nil {
		return err // it names the rank
	}
	defer c.Close()
	if w.Rank == 0 {
		fmt.Fprintf(stderr, "mnist: %d ranks, batch %d per rank (%d global), %d epochs, hidden %d, lr %g, seed %d, data %s\n",
			w.WorldSize, cfg.BatchSize, cfg.BatchSize*w.WorldSize, cfg.Epochs, cfg.Hidden, cfg.LR, cfg.Seed, dataDir)
	}
	cfg.ReportStep = w.ReportStep // gotrain top's STEP and STEP/S
	cfg.FirstAttempt = w.RestartCount == 0
	if snapshots {
		snaps, err := w.Snapshots(ctx)
		if err != nil {
			return err // it names the rank
		}
		defer snaps.Close()
		cfg.Memory = snaps
	}
	if _, err := train(ctx, c, ds, cfg, stdout); err != nil {
		return fmt.Errorf("rank %d: %w", w.Rank, err)
	}
	return nil
}

// parseFlags returns the training config and the data directory ("" to
// find it in the module cache) that args ask for.
func parseFlags(args []string, stderr io.Writer) (config, string, bool, error) {
	cfg := defaultConfig()
	var dataDir string
	var snapshots bool
	fs := flag.NewFlagSet("mnist", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, `Usage: gotrain launch [launch flags] -- mnist [flags]

Trains an MLP on MNIST, data-parallel over the job's ranks. Rank 0 prints one
line per epoch and ends with "final test_accuracy=… ranks_agree=…".

Flags:
`)
		fs.PrintDefaults()
	}
	fs.StringVar(&dataDir, "data", "", "`dir`ectory holding the MNIST IDX .gz files (default: the GoMNIST module's data/ in the module cache)")
	fs.IntVar(&cfg.Epochs, "epochs", cfg.Epochs, "passes over the training set")
	fs.IntVar(&cfg.BatchSize, "batch-size", cfg.BatchSize, "examples per rank per step; the global batch is this × ranks")
	fs.IntVar(&cfg.Hidden, "hidden", cfg.Hidden, "hidden units")
	fs.Float64Var(&cfg.LR, "lr", cfg.LR, "peak learning rate, annealed to 0 on a cosine")
	fs.Float64Var(&cfg.Momentum, "momentum", cfg.Momentum, "SGD momentum")
	fs.Uint64Var(&cfg.Seed, "seed", cfg.Seed, "seed of the initial weights and the shuffles")
	fs.IntVar(&cfg.Limit, "limit", cfg.Limit, "train on only the first `n` training images (0: all 60000)")
	fs.StringVar(&cfg.CheckpointDir, "checkpoint-dir", "", "`dir`ectory for checkpoints: rank 0 saves one after every epoch (and every --checkpoint-every steps), and a restarted run resumes from the newest valid one")
	fs.IntVar(&cfg.CheckpointEvery, "checkpoint-every", 0, "also checkpoint every `n` steps (0: only after each epoch)")
	fs.BoolVar(&snapshots, "snapshots", false, "hand the state to the agent's memory after every step (worker.Snapshots): a restarted rank resumes at its last step, before --checkpoint-dir is tried")
	fs.IntVar(&cfg.DieAtStep, "die-at-step", 0, "fault injection for tests: with --snapshots, rank --die-rank SIGKILLs itself once step `n`'s snapshot is in the agent's memory, on the job's first attempt")
	fs.IntVar(&cfg.DieRank, "die-rank", 0, "the `rank` --die-at-step kills")
	fs.BoolVar(&cfg.DieHang, "die-hang", false, "with --die-at-step: the rank waits at that step instead of SIGKILLing itself (its node's snapshots replicated), for a test that kills the node")
	fs.BoolVar(&cfg.PrintWeights, "print-weight-hash", false, "rank 0 prints its final weights' FNV-64a hash before the final line")
	if err := fs.Parse(args); err != nil {
		return config{}, "", false, err
	}
	if fs.NArg() > 0 {
		return config{}, "", false, fmt.Errorf("unexpected arguments %q (see --help)", fs.Args())
	}
	if err := cfg.validate(); err != nil {
		return config{}, "", false, fmt.Errorf("%w (see --help)", err)
	}
	return cfg, dataDir, snapshots, nil
}
