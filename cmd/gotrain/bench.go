package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/gotrain/gotrain/cmd/gotrain/internal/benchrun"
	"github.com/gotrain/gotrain/gpu/cudadrv"
	"github.com/gotrain/gotrain/internal/launcher"
	"github.com/gotrain/gotrain/internal/launcher/placement"
	"github.com/gotrain/gotrain/nccl"
	"github.com/gotrain/gotrain/worker"
)

type benchCmd struct{}

func (*benchCmd) name() string { return "bench" }
func (*benchCmd) synopsis() string {
	return "measure collectives (allreduce, all_gather, reduce_scatter, broadcast) like nccl-tests"
}

const benchUsage = `
Usage: gotrain bench allreduce|all_gather|reduce_scatter|broadcast [flags]

Measures one collective over --gpus ranks, one process per GPU started the
way 'gotrain launch' starts training workers, and prints an nccl-tests-style
table on stdout: for each size the time of one collective (the mean over
ranks of --iters back-to-back collectives after --warmup, timed with CUDA
events), algbw (size / time), busbw (algbw × 2(n-1)/n for allreduce,
(n-1)/n for all_gather and reduce_scatter, 1 for broadcast) and #wrong, the
elements that differ from the expected result. Collectives are out of place.
Exits 1 when any element is wrong.

--backend cpu runs the same benchmark on CPU ranks over TCP, with host
buffers: it needs no GPU.

Examples:
  gotrain bench allreduce --gpus 2
  gotrain bench all_gather --gpus 8 --min 1M --max 1G --json
  gotrain bench allreduce --backend cpu --gpus 4 --max 64M

With --backend cpu the defaults are smaller (--max 32M --iters 10
--warmup 2): TCP between processes moves about a GB/s, and these finish in
seconds.
`

func (c *benchCmd) run(ctx context.Context, args []string) error {
	if len(args) > 0 && args[0] == "_worker" {
		return benchWorker(ctx, args[1:])
	}
	var op string
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		op, args = args[0], args[1:]
	}
	spec := benchrun.DefaultSpec(op)
	cpuSpec := benchrun.DefaultCPUSpec(op)
	fs := newFlagSet(c.name(), benchUsage)
	var o benchOpts
	o.register(fs, &spec, cpuSpec)
	op, err := parseBenchArgs(fs, op, args)
	if err != nil {
		return err
	}
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	if err := o.settle(&spec, cpuSpec, op, given); err != nil {
		return err
	}
	return o.launch(ctx, spec)
}

// benchOpts are bench's flags other than those of the benchmark's spec.
type benchOpts struct {
	gpus          int
	backend       string
	minS, maxS    string
	jsonOut       bool
	verbose       bool
	logDir        string
	launchTimeout time.Duration
	ranksPerGPU   int
}

// register defines bench's flags on fs: o's and those of spec; cpuSpec
// gives the defaults --backend cpu changes.
func (o *benchOpts) register(fs *flag.FlagSet, spec *benchrun.Spec, cpuSpec benchrun.Spec) {
	fs.IntVar(&o.gpus, "gpus", 0, "ranks: one per GPU (default: every GPU; with --backend cpu, 2)")
	fs.IntVar(&o.gpus, "nproc-per-node", 0, "alias of --gpus")
	fs.IntVar(&o.ranksPerGPU, "ranks-per-gpu", 1, "ranks that share one GPU (NCCL ≥ 2.30, as gotrain launch --ranks-per-gpu): --gpus may then be up to GPUs × N")
	fs.StringVar(&o.backend, "backend", "nccl", "nccl (GPUs) or cpu (TCP between CPU ranks, host buffers)")
	fs.StringVar(&o.minS, "min", "8", "smallest size in bytes (suffixes K, M, G)")
	fs.StringVar(&o.maxS, "max", "4G", "largest size in bytes (suffixes K, M, G); with --backend cpu the default is "+benchrun.FormatSize(cpuSpec.Max))
	fs.Int64Var(&spec.Factor, "factor", spec.Factor, "multiply the size by this from one row to the next (2 or more)")
	fs.StringVar(&spec.DType, "dtype", spec.DType, "element type: float32, float64, int32 or int64")
	fs.StringVar(&spec.RedOp, "op", spec.RedOp, "reduction of allreduce and reduce_scatter: sum, avg, max or min")
	fs.IntVar(&spec.Root, "root", 0, "root rank of broadcast (0 to ranks-1)")
	fs.IntVar(&spec.Iters, "iters", spec.Iters, fmt.Sprintf("timed collectives per size (1 or more; with --backend cpu the default is %d)", cpuSpec.Iters))
	fs.IntVar(&spec.Warmup, "warmup", spec.Warmup, fmt.Sprintf("untimed collectives per size before timing (0 or more; with --backend cpu the default is %d)", cpuSpec.Warmup))
	fs.BoolVar(&o.jsonOut, "json", false, "print the rows as a JSON array instead of the table")
	fs.BoolVar(&o.verbose, "verbose", false, "log the agent's and the workers' steps to stderr")
	fs.StringVar(&o.logDir, "log-dir", "", "also write each rank's output to DIR/RUN_ID/attempt-N/rankN.log: a directory of its own per run (named on stderr), never through a symbolic link; a log dir lost or full mid-job is warned about once and never fails the job")
	fs.DurationVar(&o.launchTimeout, "timeout", 30*time.Minute, "stop the benchmark after this long")
}

// parseBenchArgs parses args into fs and returns the collective: op when
// it came first, else the first argument after the flags (the flags after
// that one are parsed too).
func parseBenchArgs(fs *flag.FlagSet, op string, args []string) (string, error) {
	if err := parseFlags(fs, args); err != nil {
		return "", err
	}
	if op == "" && fs.NArg() > 0 { // flags before the collective: the rest follow it
		op = fs.Arg(0)
		if err := parseFlags(fs, fs.Args()[1:]); err != nil {
			return "", err
		}
	}
	if fs.NArg() > 0 {
		return "", &usageError{msg: fmt.Sprintf("unexpected argument %q", fs.Arg(0))}
	}
	if op == "" {
		return "", &usageError{msg: "no collective given", hint: "Name one: gotrain bench allreduce (or all_gather, reduce_scatter, broadcast)."}
	}
	return op, nil
}

// settle fills in the defaults that depend on the backend (given: the
// flags on the command line), completes spec for collective op, and
// checks them all; with --backend nccl it also checks for GPUs, the
// driver and NCCL, and counts the ranks.
func (o *benchOpts) settle(spec *benchrun.Spec, cpuSpec benchrun.Spec, op string, given map[string]bool) error {
	if o.backend == "cpu" {
		if !given["max"] {
			o.maxS = benchrun.FormatSize(cpuSpec.Max)
		}
		if !given["iters"] {
			spec.Iters = cpuSpec.Iters
		}
		if !given["warmup"] {
			spec.Warmup = cpuSpec.Warmup
		}
	}
	spec.Op = op
	var err error
	if spec.Min, err = benchrun.ParseSize(o.minS); err != nil {
		return &usageError{msg: "--min: " + err.Error()}
	}
	if spec.Max, err = benchrun.ParseSize(o.maxS); err != nil {
		return &usageError{msg: "--max: " + err.Error()}
	}
	switch {
	case o.gpus < 0 || o.gpus == 0 && (given["gpus"] || given["nproc-per-node"]):
		return &usageError{msg: fmt.Sprintf("--gpus %d", o.gpus), hint: "Give 1 or more ranks (leave --gpus out for every GPU, or 2 with --backend cpu)."}
	case o.launchTimeout <= 0:
		return &usageError{msg: fmt.Sprintf("--timeout %s", o.launchTimeout), hint: "Give a positive duration, e.g. --timeout 10m."}
	}
	switch o.backend {
	case "cpu":
		if o.gpus == 0 {
			o.gpus = 2
		}
	case "nccl":
		if err := checkRanksPerGPU(&launcher.Config{Backend: o.backend, RanksPerGPU: o.ranksPerGPU}, given["ranks-per-gpu"]); err != nil { // ranksgpu.go
			return err
		}
		if o.gpus, err = benchPreflight(o.gpus, max(o.ranksPerGPU, 1)); err != nil {
			return err
		}
	default:
		return &usageError{msg: fmt.Sprintf("--backend %q: want nccl or cpu", o.backend)}
	}
	if err := spec.Validate(o.gpus); err != nil {
		return &usageError{msg: err.Error()}
	}
	return nil
}

// launch runs the benchmark spec on o.gpus workers (this program, as
// `bench _worker`) through the launcher, and prints rank 0's report.
func (o *benchOpts) launch(ctx context.Context, spec benchrun.Spec) error {
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("gotrain bench: find this program to start its workers: %w", err)
	}
	dir, err := os.MkdirTemp("", "gotrain-bench-")
	if err != nil {
		return fmt.Errorf("gotrain bench: %w", err)
	}
	defer os.RemoveAll(dir)
	resultPath := filepath.Join(dir, "report.json")
	specJSON, err := json.Marshal(spec)
	if err != nil {
		return err
	}
	workerArgs := []string{"bench", "_worker", "--spec", string(specJSON), "--result", resultPath}
	if o.verbose {
		workerArgs = append(workerArgs, "--verbose")
	}

	level := slog.LevelWarn
	if o.verbose {
		level = slog.LevelInfo
	}
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sigs)
	ctx, cancel := context.WithTimeout(ctx, o.launchTimeout)
	defer cancel()
	err = launcher.Run(ctx, launcher.Config{
		NprocPerNode: o.gpus, Backend: o.backend, RanksPerGPU: o.ranksPerGPU,
		Program: exe, Args: workerArgs, Env: os.Environ(), LogDir: o.logDir,
		GracePeriod: 5 * time.Second, Signals: sigs,
		// The table is the only thing on stdout: workers' lines go to stderr.
		Stdout: os.Stderr, Stderr: os.Stderr,
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level})),
	})
	if errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("gotrain bench: stopped after --timeout %s", o.launchTimeout)
	}
	if err != nil {
		return err
	}
	return printBenchReport(resultPath, o.jsonOut)
}

// printBenchReport prints the report rank 0 wrote to path on stdout, as
// JSON or a table, and fails when any element was wrong.
func printBenchReport(path string, jsonOut bool) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("gotrain bench: the workers finished but rank 0 left no report: %w", err)
	}
	var rep benchrun.Report
	if err := json.Unmarshal(b, &rep); err != nil {
		return fmt.Errorf("gotrain bench: rank 0's report: %w", err)
	}
	if jsonOut {
		err = rep.WriteJSON(os.Stdout)
	} else {
		err = rep.WriteTable(os.Stdout)
	}
	if err != nil {
		return err
	}
	if w := rep.Wrong(); w > 0 {
		return fmt.Errorf("gotrain bench: %d element(s) of the results are wrong", w)
	}
	return nil
}

// benchPreflight checks that GPUs, the driver and NCCL are here before any
// worker starts, and says plainly what is missing. It returns the rank
// count: gpus, or every GPU when 0, with up to ranksPerGPU ranks per GPU.
func benchPreflight(gpus, ranksPerGPU int) (int, error) {
	hint := "To measure without GPUs, run the same benchmark on CPU ranks: gotrain bench <collective> --backend cpu --gpus 2"
	gpus0 := placement.FindGPUs()
	found := gpus0.N
	if found == 0 {
		return 0, fmt.Errorf("gotrain bench: no NVIDIA GPU on this machine (%s), so there is nothing for --backend nccl to measure.\n%s", gpus0.How, hint)
	}
	drv, err := cudadrv.Load()
	if err != nil {
		return 0, fmt.Errorf("gotrain bench: %d GPU device(s) but no usable CUDA driver: %v\n%s", found, err, hint)
	}
	n, err := drv.DeviceCount()
	if err != nil {
		return 0, fmt.Errorf("gotrain bench: the CUDA driver cannot count GPUs: %v\n%s", err, hint)
	}
	if _, err := nccl.Load(); err != nil {
		return 0, fmt.Errorf("gotrain bench: NCCL is missing: %v\n%s", err, hint)
	}
	if gpus == 0 {
		gpus = n * ranksPerGPU
	}
	if gpus > n*ranksPerGPU {
		return 0, &usageError{msg: fmt.Sprintf("--gpus %d, but this machine has %d GPU(s)", gpus, n), hint: "Use at most one rank per GPU (or N with --ranks-per-gpu N, NCCL ≥ 2.30), or --backend cpu."}
	}
	return gpus, nil
}

// benchWorker is one rank of `gotrain bench`, started by it through the
// launcher: `gotrain bench _worker --spec JSON --result PATH`.
func benchWorker(ctx context.Context, args []string) error {
	fs := newFlagSet("bench _worker", "Usage: gotrain bench _worker --spec JSON --result PATH (started by gotrain bench)")
	var specJSON, resultPath string
	var verbose bool
	fs.StringVar(&specJSON, "spec", "", "the benchmark, as JSON")
	fs.StringVar(&resultPath, "result", "", "where rank 0 writes its report")
	fs.BoolVar(&verbose, "verbose", false, "log steps to stderr")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	var spec benchrun.Spec
	if err := json.Unmarshal([]byte(specJSON), &spec); err != nil {
		return fmt.Errorf("gotrain bench worker: --spec: %w", err)
	}
	level := slog.LevelWarn
	if verbose {
		level = slog.LevelDebug
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	w, err := worker.Init(ctx, worker.WithLogger(log))
	if err != nil {
		return err
	}
	defer w.Close()
	start := time.Now()
	c, err := w.NewComm(ctx, "bench")
	if err != nil {
		return err
	}
	log.Info("communicator ready", "rank", w.Rank, "backend", w.Backend, "took", time.Since(start))
	rep, err := benchrun.Run(ctx, c, w.Backend, spec, log.With("rank", w.Rank))
	if cerr := c.Close(); err == nil && cerr != nil {
		log.Warn("close the communicator", "err", cerr)
	}
	if err != nil {
		return err
	}
	if rep == nil {
		return nil
	}
	b, err := json.Marshal(rep)
	if err != nil {
		return err
	}
	tmp := resultPath + ".tmp"
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, resultPath)
}
