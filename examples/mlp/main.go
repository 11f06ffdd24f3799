package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"hash/fnv"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/gotrain/gotrain/examples/internal/mnistdata"

	"github.com/gotrain/gotrain/worker"
	"github.com/gotrain/gotrain/worker/comm"
	"github.com/gotrain/gotrain/worker/ncclcomm"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	switch {
	case errors.Is(err, flag.ErrHelp):
	case err != nil:
		fmt.Fprintln(os.Stderr, "mlp:", err)
		os.Exit(1)
	}
}

// options are the command line's settings.
type options struct {
	mode      string // "synthetic" or "mnist"
	device    string // "gpu", "cpu" or "" (gpu with the NCCL backend)
	in        int
	hidden    int
	layers    int
	classes   int
	batch     int
	steps     int
	warmup    int
	epochs    int
	precision string
	optimizer string
	lr        float64
	momentum  float64
	bucketMB  float64
	chunkMB   float64
	chunk0MB  float64 // the first layer's weight only
	accum     int
	reduceBF  bool
	commPrio  string // "normal" or "high"
	minCTAs   int
	maxCTAs   int
	wgFirst   bool
	ctaPolicy string // NCCL CTA policy: default, efficiency or zero
	symmetric bool   // GPU: gradients in an NCCL symmetric window
	transport string // GPU: auto, nccl or copy-engine
	fusedSum  bool   // GPU: the optimizer adds the peer's gradients
	seed      uint64
	data      string
	ptx       string
	trace     int  // GPU, synthetic: event timeline of the last trace timed steps
	snapEvery int  // synthetic: snapshot the state to the agent's memory every snapEvery timed steps (0: never)
	noReduce  bool // GPU, synthetic: no all-reduce (diagnostic)
	blasSM    int  // GPU: cuBLAS SM count target during backward (0: cuBLAS's choice)

	// Parsed from the strings above.
	dpTransport worker.Transport
}

func parseFlags(args []string, stderr io.Writer) (options, error) {
	o := options{}
	fs := o.flagSet(stderr)
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments %q (see --help)", fs.Args())
	}
	o.setDefaults()
	var err error
	if o.dpTransport, err = worker.ParseTransport(o.transport); err != nil {
		return o, fmt.Errorf("--transport %q: want auto, nccl or copy-engine", o.transport)
	}
	if err := o.validate(); err != nil {
		return o, err
	}
	return o, o.checkDevice()
}

// flagSet is the command line's flags, which parse into o.
func (o *options) flagSet(stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("mlp", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, `Usage: gotrain launch [launch flags] -- mlp [flags]

Trains an MLP data-parallel over the job's ranks, on GPUs (--backend nccl,
a binary built with -tags cuda) or CPUs (--backend cpu).

  --mode synthetic  the shape of PyTorch's DDP anchor (1024→4096→4096→4096→1024,
                    batch 512 per rank, fp32, SGD) on fixed random data; rank 0
                    prints "gotrain world=… step_ms=…" like the anchor
  --mode mnist      MNIST; rank 0 prints the test accuracy after each epoch

Flags:
`)
		fs.PrintDefaults()
	}
	fs.StringVar(&o.mode, "mode", "synthetic", "synthetic or mnist")
	fs.StringVar(&o.device, "device", "", "gpu or cpu (default: gpu with --backend nccl, else cpu)")
	fs.IntVar(&o.in, "in", 1024, "synthetic: inputs")
	fs.IntVar(&o.hidden, "hidden", 0, "hidden units (default 4096 synthetic, 1024 mnist)")
	fs.IntVar(&o.layers, "layers", 0, "linear layers (default 4 synthetic, 3 mnist)")
	fs.IntVar(&o.classes, "classes", 1024, "synthetic: classes")
	fs.IntVar(&o.batch, "batch", 0, "examples per rank per step (default 512 synthetic, 128 mnist)")
	fs.IntVar(&o.steps, "steps", 100, "synthetic: timed steps")
	fs.IntVar(&o.warmup, "warmup", 10, "synthetic: untimed steps first")
	fs.IntVar(&o.epochs, "epochs", 10, "mnist: passes over the training set")
	fs.StringVar(&o.precision, "precision", "fp32", "fp32, or bf16 (bfloat16 GEMM inputs, float32 accumulation and master weights; GPU only)")
	fs.StringVar(&o.optimizer, "optimizer", "", "sgd, momentum or adam (default sgd synthetic, momentum mnist)")
	fs.Float64Var(&o.lr, "lr", 0, "learning rate (default 1e-3 synthetic, 0.05 mnist, cosine-annealed)")
	fs.Float64Var(&o.momentum, "momentum", 0.9, "momentum of --optimizer momentum")
	fs.Float64Var(&o.bucketMB, "bucket-mb", 25, "gradient bucket size in MiB")
	fs.Float64Var(&o.chunkMB, "chunk-mb", 0, "split each weight's gradient into DataParallel parameters of about this many MiB, so that its all-reduce starts while the rest of it is computed (0: no split)")
	fs.Float64Var(&o.chunk0MB, "chunk-first-mb", 0, "split only the first layer's weight gradient (the last one backward computes, whose all-reduce nothing overlaps) into DataParallel parameters of about this many MiB; with a --bucket-mb as small, each piece's all-reduce starts while the next is computed (0: as --chunk-mb)")
	fs.IntVar(&o.accum, "accum", 1, "gradient accumulation: micro-steps per all-reduce")
	fs.BoolVar(&o.reduceBF, "reduce-bf16", false, "all-reduce the gradients in bfloat16")
	fs.StringVar(&o.commPrio, "comm-priority", "normal", "priority of the NCCL communication stream: normal, or high (its collectives and optimizer steps take SMs ahead of the GEMMs)")
	fs.IntVar(&o.minCTAs, "nccl-min-ctas", 0, "NCCL: at least this many CTAs per collective (ncclConfig_t minCTAs; 0: NCCL's choice)")
	fs.IntVar(&o.maxCTAs, "nccl-max-ctas", 0, "NCCL: at most this many CTAs per collective, leaving SMs to the GEMMs beside it (ncclConfig_t maxCTAs; 0: NCCL's choice)")
	fs.BoolVar(&o.wgFirst, "weight-grad-first", true, "backward computes each weight's gradient before the input gradient, so that its all-reduce starts a GEMM earlier (the optimizer waits for the input gradient: DataParallelConfig.DeferUpdate)")
	fs.StringVar(&o.ctaPolicy, "nccl-cta-policy", "default", "NCCL CTA policy (ncclConfig_t CTAPolicy, NCCL 2.27+): default, efficiency (fewest CTAs with decent bandwidth, for overlap with compute) or zero")
	fs.StringVar(&o.transport, "transport", "auto", "GPU: how the gradients travel: auto (copy-engine for two ranks of one node, else nccl), nccl (NCCL's all-reduce), or copy-engine (each GPU copies its gradients into the other's memory with a copy engine and adds them: DataParallelConfig.Transport)")
	fs.BoolVar(&o.fusedSum, "fused-sum", true, "GPU, copy-engine transport: the optimizer adds the peer's gradients as it reads them instead of a separate sum kernel (DataParallelConfig.FusedSum)")
	fs.BoolVar(&o.symmetric, "nccl-symmetric", false, "GPU: allocate the gradients with ncclMemAlloc and register them as a symmetric window (NCCL 2.27+), so NCCL may reduce them with its symmetric-memory kernels; needs NCCL_CUMEM_ENABLE=1 in the environment")
	fs.Uint64Var(&o.seed, "seed", 1, "seed of the initial weights and the data")
	fs.StringVar(&o.data, "data", "", "mnist: directory of the MNIST IDX .gz files (default: the GoMNIST module's data/)")
	fs.StringVar(&o.ptx, "ptx", "", "load the CUDA kernels from this PTX file instead of the embedded one")
	fs.IntVar(&o.snapEvery, "snapshot-every", 0, "synthetic: hand the parameters and optimizer state to the agent's memory (worker.Snapshots) every `n` timed steps, from the device on a GPU, to measure what it costs a step (0: never)")
	fs.IntVar(&o.trace, "trace", 0, "synthetic, GPU: each rank prints a CUDA event timeline of the last N timed steps (forward, backward per layer, each bucket's all-reduce and update) and a summary (0: off)")
	fs.BoolVar(&o.noReduce, "no-reduce", false, "synthetic, GPU, diagnostic: never all-reduce the gradients; each rank applies its own, so the ranks diverge (the step without communication)")
	fs.IntVar(&o.blasSM, "blas-sm-target", 0, "GPU: cuBLAS SM count target for backward's GEMMs, leaving the other SMs to NCCL (cublasSetSmCountTarget, cuBLAS 11.3+; 0: cuBLAS's choice)")
	return fs
}

// setDefaults fills in the settings whose default depends on the mode.
func (o *options) setDefaults() {
	def := func(v *int, synth, mnist int) {
		if *v == 0 {
			*v = synth
			if o.mode == "mnist" {
				*v = mnist
			}
		}
	}
	def(&o.hidden, 4096, 1024)
	def(&o.layers, 4, 3)
	def(&o.batch, 512, 128)
	if o.optimizer == "" {
		o.optimizer = map[bool]string{true: "momentum", false: "sgd"}[o.mode == "mnist"]
	}
	if o.lr == 0 {
		o.lr = map[bool]float64{true: 0.05, false: 1e-3}[o.mode == "mnist"]
	}
}

// validate rejects settings out of range, in the order of the checks below
// (the first that fails is the error).
func (o options) validate() error {
	for _, c := range []struct {
		bad bool
		err error
	}{
		{o.mode != "synthetic" && o.mode != "mnist", fmt.Errorf("--mode %q: want synthetic or mnist", o.mode)},
		{o.precision != "fp32" && o.precision != "bf16", fmt.Errorf("--precision %q: want fp32 or bf16", o.precision)},
		{o.device != "" && o.device != "gpu" && o.device != "cpu", fmt.Errorf("--device %q: want gpu or cpu", o.device)},
		{o.commPrio != "normal" && o.commPrio != "high", fmt.Errorf("--comm-priority %q: want normal or high", o.commPrio)},
		{o.minCTAs < 0 || o.maxCTAs < 0 || (o.minCTAs > 0 && o.maxCTAs > 0 && o.minCTAs > o.maxCTAs), fmt.Errorf("--nccl-min-ctas %d, --nccl-max-ctas %d: want 0 (NCCL's choice) or more, min ≤ max", o.minCTAs, o.maxCTAs)},
		{o.chunk0MB < 0, errors.New("--chunk-first-mb must not be negative")},
		{!validCTAPolicy(o.ctaPolicy), fmt.Errorf("--nccl-cta-policy %q: want default, efficiency or zero", o.ctaPolicy)},
		{o.layers < 1 || o.hidden < 1 || o.batch < 1 || o.accum < 1 || o.bucketMB <= 0 || o.chunkMB < 0, errors.New("--layers, --hidden, --batch, --accum and --bucket-mb must be positive, --chunk-mb not negative")},
		{o.trace < 0 || o.blasSM < 0, fmt.Errorf("--trace %d, --blas-sm-target %d: want 0 (off) or more", o.trace, o.blasSM)},
		{o.trace > o.steps, fmt.Errorf("--trace %d: at most --steps (%d)", o.trace, o.steps)},
		{(o.trace > 0 || o.noReduce) && o.mode != "synthetic", errors.New("--trace and --no-reduce are for --mode synthetic")},
		{o.noReduce && o.accum > 1, errors.New("--no-reduce takes no --accum")},
	} {
		if c.bad {
			return c.err
		}
	}
	return nil
}

// checkDevice rejects the GPU diagnostics on the CPU path.
func (o options) checkDevice() error {
	if o.device != "cpu" {
		return nil
	}
	for _, f := range []struct {
		set  bool
		name string
	}{{o.trace > 0, "--trace"}, {o.noReduce, "--no-reduce"}, {o.blasSM > 0, "--blas-sm-target"}, {o.symmetric, "--nccl-symmetric"}} {
		if f.set {
			return fmt.Errorf("%s is for the GPU path (--device gpu)", f.name)
		}
	}
	return nil
}

// commOptions are the communicator's options the flags ask for.
func (o options) commOptions() []worker.CommOption {
	var opts []worker.CommOption
	if o.commPrio == "high" {
		opts = append(opts, worker.WithHighPriorityStream())
	}
	if o.minCTAs > 0 || o.maxCTAs > 0 {
		opts = append(opts, worker.WithNCCLCTAs(o.minCTAs, o.maxCTAs))
	}
	if p, err := ncclcomm.ParseCTAPolicy(o.ctaPolicy); err == nil && p != ncclcomm.CTAPolicyDefault {
		opts = append(opts, worker.WithNCCLCTAPolicy(p))
	}
	return opts
}

func validCTAPolicy(s string) bool {
	_, err := ncclcomm.ParseCTAPolicy(s)
	return err == nil
}

func (o options) arch(in, classes int) arch {
	dims := []int{in}
	for range o.layers - 1 {
		dims = append(dims, o.hidden)
	}
	return arch{dims: append(dims, classes)}
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	o, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	w, err := worker.Init(ctx, worker.WithLogger(log))
	if errors.Is(err, worker.ErrNotLaunched) {
		return fmt.Errorf("%w\n\tfor example: bin/gotrain launch --nproc-per-node 2 --backend nccl -- bin/mlp", err)
	}
	if err != nil {
		return err
	}
	defer w.Close()
	if o.device == "" {
		o.device = map[bool]string{true: "gpu", false: "cpu"}[w.Backend == "nccl"]
	}
	if o.device == "gpu" && w.Backend != "nccl" {
		return errors.New("--device gpu needs `gotrain launch --backend nccl`")
	}
	if err := o.checkDevice(); err != nil {
		return err
	}
	c, err := w.NewComm(ctx, "mlp", o.commOptions()...)
	if err != nil {
		return err
	}
	defer c.Close()

	in, classes := o.in, o.classes
	var ds *mnistdata.Dataset
	if o.mode == "mnist" {
		if o.data == "" {
			if o.data, err = mnistdata.DefaultDir(); err != nil {
				return fmt.Errorf("rank %d: %w", w.Rank, err)
			}
		}
		if ds, err = mnistdata.Load(o.data); err != nil {
			return fmt.Errorf("rank %d: %w", w.Rank, err)
		}
		in, classes = mnistdata.Pixels, mnistdata.Classes
	}
	cfg := modelConfig{
		Arch: o.arch(in, classes), Batch: o.batch, Seed: o.seed, PTXPath: o.ptx,
		BF16GEMM: o.precision == "bf16", ChunkBytes: int(o.chunkMB * (1 << 20)), FirstChunk: int(o.chunk0MB * (1 << 20)),
		Optim: optim{Kind: o.optimizer, LR: float32(o.lr), Momentum: float32(o.momentum), Beta1: 0.9, Beta2: 0.999, Eps: 1e-8},
		DP: worker.DataParallelConfig{
			BucketBytes: int(o.bucketMB * (1 << 20)), AccumulationSteps: o.accum, BF16: o.reduceBF, Logger: log,
			DeferUpdate: o.wgFirst, Transport: o.dpTransport, FusedSum: o.fusedSum,
		},
		Device:   ncclcomm.DeviceFor(w.GPU, os.Getenv),
		NoReduce: o.noReduce, BlasSMTarget: o.blasSM, Symmetric: o.symmetric,
	}
	if o.trace > 0 {
		cfg.Trace = traceConfig{Steps: o.trace, Skip: o.warmup + o.steps - o.trace, First: o.steps - o.trace}
	}
	if err := cfg.Optim.validate(); err != nil {
		return err
	}
	var m model
	if o.device == "gpu" {
		m, err = newGPUModel(ctx, c, cfg)
	} else {
		if cfg.BF16GEMM {
			return errors.New("--precision bf16 is for GPUs")
		}
		m, err = newCPUModel(ctx, c, cfg)
	}
	if err != nil {
		return fmt.Errorf("rank %d: %w", w.Rank, err)
	}
	defer m.Close()
	var snaps *worker.Snapshots
	if o.snapEvery > 0 {
		if snaps, err = w.Snapshots(ctx); err != nil {
			return err
		}
		defer snaps.Close()
	}
	if o.mode == "mnist" {
		err = trainMNIST(ctx, c, m, ds, o, stdout)
	} else {
		err = synthetic(ctx, c, m, cfg, o, snaps, stdout)
	}
	if err != nil {
		return fmt.Errorf("rank %d: %w", w.Rank, err)
	}
	return nil
}

// loadRandomBatch loads one fixed random batch of o.batch samples, drawn
// from o.seed and the rank, into m.
func loadRandomBatch(m model, a arch, o options, rank int) error {
	rng := rand.New(rand.NewPCG(o.seed, uint64(rank)))
	x := make([]float32, o.batch*a.dims[0])
	for i := range x {
		x[i] = float32(rng.NormFloat64())
	}
	y := make([]int32, o.batch)
	for i := range y {
		y[i] = int32(rng.IntN(a.dims[len(a.dims)-1]))
	}
	return m.Load(x, y)
}

// prewarmSnapshots allocates and page-locks both snapshot buffers before the
// timed steps, as in a job that has run a while (nil snaps: snapshots off).
func prewarmSnapshots(ctx context.Context, m model, snaps *worker.Snapshots) error {
	for range 2 {
		if snaps == nil {
			return nil
		}
		if err := snapshot(m, snaps, 0); err != nil {
			return err
		}
		if err := snaps.Wait(ctx); err != nil {
			return err
		}
	}
	return nil
}

// synthetic times steps on one fixed random batch, as the PyTorch anchor does.
func synthetic(ctx context.Context, c comm.Comm, m model, cfg modelConfig, o options, snaps *worker.Snapshots, out io.Writer) error {
	a := cfg.Arch
	if err := loadRandomBatch(m, a, o, c.Rank()); err != nil {
		return err
	}
	for range o.warmup {
		if err := m.Step(ctx); err != nil {
			return err
		}
	}
	first, err := m.Loss()
	if err != nil {
		return err
	}
	if err := prewarmSnapshots(ctx, m, snaps); err != nil {
		return err
	}
	if err := c.Barrier(ctx); err != nil {
		return err
	}
	start := time.Now()
	for i := range o.steps {
		if err := m.Step(ctx); err != nil {
			return err
		}
		if snaps != nil && (i+1)%o.snapEvery == 0 {
			if err := snapshot(m, snaps, int64(i+1)); err != nil {
				return err
			}
		}
	}
	if err := m.Sync(); err != nil {
		return err
	}
	dt := time.Since(start)
	last, err := m.Loss()
	if err != nil {
		return err
	}
	agree, reduce := "n/a", "off" // --no-reduce: the ranks diverge by design
	if !o.noReduce {
		same, err := ranksAgree(ctx, c, m)
		if err != nil {
			return err
		}
		agree, reduce = fmt.Sprint(same), "on"
	}
	if c.Rank() == 0 {
		stepMS := dt.Seconds() / float64(o.steps) * 1e3
		fmt.Fprintf(out, "gotrain world=%d params=%d batch/gpu=%d step_ms=%.3f samples_per_s=%.0f device=%s precision=%s reduce_bf16=%t arch=%s loss=%.4f->%.4f ranks_agree=%s comm_priority=%s nccl_ctas=%d..%d cta_policy=%s symmetric=%t weight_grad_first=%t dp_tuning=%q bucket_mb=%g chunk_mb=%g chunk_first_mb=%g reduce=%s blas_sm_target=%d trace=%d transport=%s fused_sum=%t\n",
			c.Size(), a.numParams(), o.batch, stepMS, float64(o.batch*c.Size()*o.steps)/dt.Seconds(),
			o.device, o.precision, o.reduceBF, a, first, last, agree, o.commPrio, o.minCTAs, o.maxCTAs, o.ctaPolicy, o.symmetric, o.wgFirst, os.Getenv(worker.TuningEnv), o.bucketMB,
			o.chunkMB, o.chunk0MB, reduce, o.blasSM, o.trace, m.Transport(), o.fusedSum)
	}
	if snaps != nil && c.Rank() == 0 {
		if err := snaps.Wait(ctx); err != nil {
			return err
		}
		st := snaps.Stats()
		fmt.Fprintf(out, "snapshots every=%d saved=%d skipped=%d failed=%d bytes=%d last_copy_ms=%.3f last_handover_ms=%.3f (2 saved in warm-up)\n",
			o.snapEvery, st.Saved, st.Skipped, st.Failed, st.Bytes, st.Copy.Seconds()*1e3, st.Handed.Seconds()*1e3)
	}
	if tw, ok := m.(traceWriter); ok && o.trace > 0 {
		return tw.WriteTrace(out, c.Rank())
	}
	return nil
}

// traceWriter is a model that recorded a --trace timeline (the GPU model).
type traceWriter interface {
	// WriteTrace prints the timeline and its summary; call it after Sync.
	WriteTrace(w io.Writer, rank int) error
}

// ranksAgree reports whether every rank holds bitwise the same parameters.
func ranksAgree(ctx context.Context, c comm.Comm, m model) (bool, error) {
	p, err := m.Params()
	if err != nil {
		return false, err
	}
	h := fnv.New64a()
	h.Write(comm.Host(p).HostBytes())
	mine := []int64{int64(h.Sum64())}
	all := make([]int64, c.Size())
	if err := c.AllGather(ctx, comm.Host(mine), comm.Host(all)); err != nil {
		return false, fmt.Errorf("all-gather the weight hashes: %w", err)
	}
	for _, v := range all {
		if v != mine[0] {
			return false, nil
		}
	}
	return true, nil
}

// trainMNIST trains for o.epochs, each rank on its share of every shuffled
// epoch, with a cosine learning rate; rank 0 prints the test accuracy.
func trainMNIST(ctx context.Context, c comm.Comm, m model, ds *mnistdata.Dataset, o options, out io.Writer) error {
	rank, world := c.Rank(), c.Size()
	n := ds.Train.Len()
	perRank := n / world
	stepsPerEpoch := perRank / o.batch
	total := stepsPerEpoch * o.epochs
	rng := rand.New(rand.NewPCG(o.seed, 99)) // the same on every rank
	order := make([]int, n)
	for i := range order {
		order[i] = i
	}
	x := make([]float32, o.batch*mnistdata.Pixels)
	y := make([]int32, o.batch)
	step := 0
	start := time.Now()
	for epoch := range o.epochs {
		rng.Shuffle(n, func(i, j int) { order[i], order[j] = order[j], order[i] })
		mine := order[rank*perRank : (rank+1)*perRank]
		var lossSum float64
		for s := range stepsPerEpoch {
			idx := mine[s*o.batch : (s+1)*o.batch]
			for r, i := range idx {
				row := x[r*mnistdata.Pixels : (r+1)*mnistdata.Pixels]
				for j, p := range ds.Train.Image(i) {
					row[j] = float32(p) * (1.0 / 255)
				}
				y[r] = int32(ds.Train.Labels[i])
			}
			if err := m.Load(x, y); err != nil {
				return err
			}
			m.SetLR(float32(o.lr * 0.5 * (1 + math.Cos(math.Pi*float64(step)/float64(total)))))
			if err := m.Step(ctx); err != nil {
				return err
			}
			if s%50 == 0 {
				l, err := m.Loss()
				if err != nil {
					return err
				}
				lossSum += float64(l)
			}
			step++
		}
		acc, err := testAccuracy(ctx, c, m, ds)
		if err != nil {
			return err
		}
		if rank == 0 {
			fmt.Fprintf(out, "epoch %d loss=%.4f test_accuracy=%.4f elapsed=%s\n", epoch+1,
				lossSum/float64((stepsPerEpoch+49)/50), acc, time.Since(start).Round(time.Millisecond))
		}
	}
	acc, err := testAccuracy(ctx, c, m, ds)
	if err != nil {
		return err
	}
	agree, err := ranksAgree(ctx, c, m)
	if err != nil {
		return err
	}
	if rank == 0 {
		fmt.Fprintf(out, "final test_accuracy=%.4f ranks_agree=%t transport=%s\n", acc, agree, m.Transport())
	}
	return nil
}

// testAccuracy classifies the test set, each rank its share, and sums the
// counts over the ranks.
func testAccuracy(ctx context.Context, c comm.Comm, m model, ds *mnistdata.Dataset) (float64, error) {
	s := &ds.Test
	from, to := c.Rank()*s.Len()/c.Size(), (c.Rank()+1)*s.Len()/c.Size()
	x := make([]float32, (to-from)*mnistdata.Pixels)
	for i := from; i < to; i++ {
		for j, p := range s.Image(i) {
			x[(i-from)*mnistdata.Pixels+j] = float32(p) * (1.0 / 255)
		}
	}
	pred, err := m.Predict(x, to-from)
	if err != nil {
		return 0, err
	}
	counts := []int64{0}
	for i, p := range pred {
		if int(p) == int(s.Labels[from+i]) {
			counts[0]++
		}
	}
	if err := c.AllReduce(ctx, comm.Host(counts), comm.Host(counts), comm.Sum); err != nil {
		return 0, err
	}
	return float64(counts[0]) / float64(s.Len()), nil
}

// snapshot hands the state after step to the agent's memory: the step's
// work must be done first (a snapshot is one step's state, not a mix).
func snapshot(m model, snaps *worker.Snapshots, step int64) error {
	if err := m.Sync(); err != nil {
		return err
	}
	snaps.Save(step, m.State()...)
	return nil
}
