package main

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"strconv"
	"syscall"
	"time"

	"github.com/gotrain/gotrain/examples/internal/mnistdata"

	"github.com/gotrain/gotrain/worker"
	"github.com/gotrain/gotrain/worker/checkpoint"
	"github.com/gotrain/gotrain/worker/comm"
)

// config is one training run's settings. defaultConfig is complete; main
// overrides fields from flags.
type config struct {
	Epochs    int     // passes over the training set
	BatchSize int     // examples per rank per step; the global batch is BatchSize × ranks
	Hidden    int     // hidden units
	LR        float64 // peak learning rate, annealed to 0 on a cosine over the run
	Momentum  float64 // SGD momentum
	Seed      uint64  // initial weights and the per-epoch shuffles
	Limit     int     // use only the first Limit training images; 0 for all
	// CheckpointDir, when set, receives a checkpoint (rank 0 writes) after
	// every epoch and every CheckpointEvery steps; a run resumes from the
	// newest valid one there.
	CheckpointDir   string
	CheckpointEvery int
	// Memory, when set, is given the state after every step (in memory,
	// the hand-over overlapping the next step) and asked for it first at
	// start: a restarted rank resumes at its last step (worker.Snapshots).
	Memory *worker.Snapshots
	// DieAtStep, when above 0, SIGKILLs rank DieRank once the snapshot of
	// that step is in its agent's memory, on the job's first attempt: a
	// fault for tests of the tier.
	DieAtStep, DieRank int
	// DieHang: at DieAtStep, rank DieRank waits (forever) instead of
	// SIGKILLing itself, for a test that kills its whole node then.
	DieHang      bool
	FirstAttempt bool // GOTRAIN_RESTART_COUNT is 0
	// PrintWeights makes rank 0 print its final weights' FNV-64a hash
	// before the final line (tests compare runs bit for bit).
	PrintWeights bool
	// ReportStep, when set, is told the step after every step, with the
	// samples per second of the whole job (main gives worker's
	// Worker.ReportStep, so gotrain top shows STEP and STEP/S).
	ReportStep func(step int64, samplesPerSecond float64)
}

func defaultConfig() config {
	return config{
		Epochs:    5,
		BatchSize: 32,
		Hidden:    128,
		LR:        0.1,
		Momentum:  0.9,
		Seed:      1,
	}
}

func (c config) validate() error {
	var errs []error
	if c.Epochs < 1 {
		errs = append(errs, fmt.Errorf("epochs is %d, want at least 1", c.Epochs))
	}
	if c.BatchSize < 1 {
		errs = append(errs, fmt.Errorf("batch size is %d, want at least 1", c.BatchSize))
	}
	if c.Hidden < 1 {
		errs = append(errs, fmt.Errorf("hidden is %d, want at least 1", c.Hidden))
	}
	if !(c.LR > 0) {
		errs = append(errs, fmt.Errorf("learning rate is %v, want more than 0", c.LR))
	}
	if !(c.Momentum >= 0 && c.Momentum < 1) {
		errs = append(errs, fmt.Errorf("momentum is %v, want 0 ≤ momentum < 1", c.Momentum))
	}
	if c.CheckpointEvery < 0 {
		errs = append(errs, fmt.Errorf("checkpoint every is %d, want 0 (every epoch) or more", c.CheckpointEvery))
	}
	if c.Limit < 0 {
		errs = append(errs, fmt.Errorf("limit is %d, want 0 (all) or more", c.Limit))
	}
	return errors.Join(errs...)
}

// result is what a training run ends with; every rank gets the same one.
type result struct {
	Epochs       int
	Loss         float64 // mean training loss of the last epoch, over all ranks
	TestAccuracy float64 // on the whole test set, after the last epoch
	// WeightHash is this rank's FNV-64a hash of its final parameters;
	// RanksAgree says whether every rank's hash is the same.
	WeightHash uint64
	RanksAgree bool
	Elapsed    time.Duration
}

// evalChunk is how many test images one forward pass of the evaluation takes.
const evalChunk = 500

// train trains an MLP on ds with every rank of c, data-parallel: each rank
// takes its own 1/Size() share of the training images, and after every
// backward pass the gradients are averaged over the ranks with one
// all-reduce, so that every rank applies the same update and the weights stay
// identical. Rank 0 writes one line per epoch and a final line to out.
func train(ctx context.Context, c comm.Comm, ds *mnistdata.Dataset, cfg config, out io.Writer) (result, error) {
	if err := cfg.validate(); err != nil {
		return result{}, fmt.Errorf("config: %w", err)
	}
	t, err := newTrainer(ctx, c, ds, cfg, out)
	if err != nil {
		return result{}, err
	}
	for epoch := t.step/t.stepsPerEpoch + 1; epoch <= cfg.Epochs; epoch++ {
		if err := t.epoch(ctx, epoch); err != nil {
			return result{}, err
		}
	}
	return t.finish(ctx)
}

// trainer is one rank's training run.
type trainer struct {
	c                comm.Comm
	ds               *mnistdata.Dataset
	cfg              config
	out              io.Writer
	start, stepStart time.Time // the run's; the step's, for the samples per second ReportStep gets
	rank, world      int

	shardStart, shardLen      int
	stepsPerEpoch, totalSteps int
	step                      int // steps done

	m              *mlp
	grad, velocity []float32
	ws, evalWS     *workspace
	order          []int
	labels         []uint8
	// stats is all-reduced once an epoch: loss sum and example count of the
	// training steps, then correct and total of the test evaluation.
	stats []float64
	res   result
}

// newTrainer takes this rank's shard of the training set, builds the model
// and restores the newest state (from memory or a checkpoint).
func newTrainer(ctx context.Context, c comm.Comm, ds *mnistdata.Dataset, cfg config, out io.Writer) (*trainer, error) {
	t := &trainer{c: c, ds: ds, cfg: cfg, out: out, start: time.Now(), rank: c.Rank(), world: c.Size()}
	n := ds.Train.Len()
	if cfg.Limit > 0 && cfg.Limit < n {
		n = cfg.Limit
	}
	// Every rank takes the same number of images, so that every rank runs the
	// same number of steps (and collectives); at most world-1 images go unused.
	t.shardLen = n / t.world
	if t.shardLen == 0 {
		return nil, fmt.Errorf("%d training images cannot be shared by %d ranks (raise --limit)", n, t.world)
	}
	t.shardStart = t.rank * t.shardLen

	t.m = newMLP(mnistdata.Pixels, cfg.Hidden, mnistdata.Classes)
	t.m.initWeights(cfg.Seed)
	t.grad = make([]float32, len(t.m.params))
	t.velocity = make([]float32, len(t.m.params))
	// Every rank drew the same weights, or loaded the same checkpoint; rank
	// 0's copy is broadcast anyway, so that the ranks start identical even if
	// that ever stopped being true.
	st := trainState{Params: t.m.params, Velocity: t.velocity}
	from, err := restore(ctx, c, cfg.Memory, cfg.CheckpointDir, &st, out)
	if err != nil {
		return nil, err
	}

	t.ws = t.m.newWorkspace(cfg.BatchSize)
	t.evalWS = t.m.newWorkspace(evalChunk)
	t.order = make([]int, t.shardLen)
	t.labels = make([]uint8, cfg.BatchSize)
	t.stats = make([]float64, 4)
	t.stepsPerEpoch = (t.shardLen + cfg.BatchSize - 1) / cfg.BatchSize
	t.totalSteps, t.step = cfg.Epochs*t.stepsPerEpoch, st.Step
	t.res.Loss, t.res.TestAccuracy, t.res.Epochs = st.Loss, st.Accuracy, t.step/t.stepsPerEpoch
	if from != "" && t.rank == 0 {
		fmt.Fprintf(out, "resumed at epoch %d step %d of %d (global step %d) from %s\n", t.step/t.stepsPerEpoch+1, t.step%t.stepsPerEpoch, t.stepsPerEpoch, t.step, from)
	}
	t.stepStart = time.Now()
	if cfg.ReportStep != nil {
		cfg.ReportStep(int64(t.step), 0)
	}
	return t, nil
}

// save writes a checkpoint (rank 0, with a checkpoint directory).
func (t *trainer) save() error {
	if t.rank != 0 || t.cfg.CheckpointDir == "" {
		return nil
	}
	s := trainState{Step: t.step, Loss: t.res.Loss, Accuracy: t.res.TestAccuracy, Params: t.m.params, Velocity: t.velocity}
	return checkpoint.Dir{Path: t.cfg.CheckpointDir}.Save(int64(t.step), s.encode())
}

// epoch trains one pass over the shard (the rest of it after a resume),
// then evaluates, reports and saves.
func (t *trainer) epoch(ctx context.Context, epoch int) error {
	cfg := t.cfg
	skip := (t.step % t.stepsPerEpoch) * cfg.BatchSize // steps of this epoch taken before a resume
	// The same seed on every rank; each permutes its own shard.
	rng := rand.New(rand.NewPCG(cfg.Seed, uint64(epoch)))
	for i := range t.order {
		t.order[i] = t.shardStart + i
	}
	rng.Shuffle(len(t.order), func(i, j int) { t.order[i], t.order[j] = t.order[j], t.order[i] })

	var lossSum float64
	for from := skip; from < t.shardLen; from += cfg.BatchSize {
		loss, err := t.trainStep(ctx, epoch, t.order[from:min(from+cfg.BatchSize, t.shardLen)])
		if err != nil {
			return err
		}
		lossSum += loss
	}
	return t.endEpoch(ctx, epoch, lossSum)
}

// trainStep takes one step on the images batch and returns its loss sum.
func (t *trainer) trainStep(ctx context.Context, epoch int, batch []int) (float64, error) {
	cfg, m := t.cfg, t.m
	loadBatch(t.ws.x, t.labels, &t.ds.Train, batch)
	loss := m.lossAndGrad(t.ws, t.labels[:len(batch)], t.grad)
	g := comm.Host(t.grad)
	if err := t.c.AllReduce(ctx, g, g, comm.Avg); err != nil {
		return 0, fmt.Errorf("epoch %d: all-reduce the gradients: %w", epoch, err)
	}
	lr := cosineLR(cfg.LR, t.step, t.totalSteps)
	sgdStep(m.params, t.velocity, t.grad, float32(lr), float32(cfg.Momentum))
	t.step++
	if cfg.Memory != nil {
		if err := t.snapshot(ctx); err != nil {
			return 0, err
		}
	}
	if cfg.ReportStep != nil {
		now := time.Now()
		cfg.ReportStep(int64(t.step), float64(len(batch)*t.world)/now.Sub(t.stepStart).Seconds())
		t.stepStart = now
	}
	// A step that ends the epoch is saved after the evaluation.
	if cfg.CheckpointEvery > 0 && t.step%cfg.CheckpointEvery == 0 && t.step%t.stepsPerEpoch != 0 {
		if err := t.save(); err != nil {
			return 0, err
		}
	}
	return loss * float64(len(batch)), nil
}

// snapshot hands the state to the in-memory tier, and at DieAtStep (rank
// DieRank, first attempt) dies or hangs once it is there.
func (t *trainer) snapshot(ctx context.Context) error {
	cfg, step := t.cfg, t.step
	s := trainState{Step: step, Loss: t.res.Loss, Accuracy: t.res.TestAccuracy, Params: t.m.params}
	params, velocity := comm.Host(t.m.params).HostBytes(), comm.Host(t.velocity).HostBytes()
	cfg.Memory.SaveBytes(int64(step), s.header(), params, velocity)
	if step != cfg.DieAtStep || t.rank != cfg.DieRank || !cfg.FirstAttempt {
		return nil
	}
	// This step's snapshot was skipped if the previous hand-over was
	// still in flight: save it now.
	if err := cfg.Memory.Wait(ctx); err != nil {
		return err
	}
	cfg.Memory.SaveBytes(int64(step), s.header(), params, velocity)
	if err := cfg.Memory.Wait(ctx); err != nil {
		return err
	}
	if cfg.DieHang {
		fmt.Fprintf(t.out, "waiting at step %d for the node to be killed\n", step)
		<-ctx.Done()
		return ctx.Err()
	}
	fmt.Fprintf(t.out, "dying at step %d: SIGKILL\n", step)
	_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
	return nil
}

// endEpoch evaluates on the test set, averages loss and accuracy over the
// ranks, prints the epoch's line (rank 0) and saves a checkpoint.
func (t *trainer) endEpoch(ctx context.Context, epoch int, lossSum float64) error {
	correct, total := evaluate(t.m, t.evalWS, &t.ds.Test, t.rank, t.world)
	stats := t.stats
	stats[0], stats[1], stats[2], stats[3] = lossSum, float64(t.shardLen), float64(correct), float64(total)
	s := comm.Host(stats)
	if err := t.c.AllReduce(ctx, s, s, comm.Sum); err != nil {
		return fmt.Errorf("epoch %d: all-reduce the loss and accuracy: %w", epoch, err)
	}
	t.res.Epochs = epoch
	t.res.Loss = stats[0] / stats[1]
	t.res.TestAccuracy = stats[2] / stats[3]
	if t.rank == 0 {
		fmt.Fprintf(t.out, "epoch=%d loss=%.4f test_accuracy=%s elapsed=%.1fs\n",
			epoch, t.res.Loss, formatAccuracy(t.res.TestAccuracy), time.Since(t.start).Seconds())
	}
	return t.save()
}

// finish compares the ranks' final weights and prints the final line.
func (t *trainer) finish(ctx context.Context) (result, error) {
	res := t.res
	agree, hash, err := compareWeights(ctx, t.c, t.m.params)
	if err != nil {
		return result{}, err
	}
	res.WeightHash, res.RanksAgree = hash, agree
	res.Elapsed = time.Since(t.start)
	if t.rank == 0 && t.cfg.PrintWeights {
		fmt.Fprintf(t.out, "weights fnv64a=%016x\n", hash)
	}
	if t.rank == 0 {
		fmt.Fprintf(t.out, "final test_accuracy=%s ranks_agree=%t\n", formatAccuracy(res.TestAccuracy), res.RanksAgree)
	}
	return res, nil
}

// formatAccuracy writes an accuracy as the output lines show it.
func formatAccuracy(a float64) string { return strconv.FormatFloat(a, 'f', 4, 64) }

// loadBatch copies the images idx of s into x, scaled to [0, 1], and, unless
// labels is nil, their labels into labels.
func loadBatch(x []float32, labels []uint8, s *mnistdata.Split, idx []int) {
	for r, i := range idx {
		row := x[r*mnistdata.Pixels : (r+1)*mnistdata.Pixels]
		for j, p := range s.Image(i) {
			row[j] = float32(p) * (1.0 / 255)
		}
		if labels != nil {
			labels[r] = s.Labels[i]
		}
	}
}

// cosineLR is the learning rate of step (from 0) of total: peak at the
// start, falling on a half cosine towards 0.
func cosineLR(peak float64, step, total int) float64 {
	return peak * 0.5 * (1 + math.Cos(math.Pi*float64(step)/float64(total)))
}

// sgdStep applies one step of SGD with momentum:
// v ← μv + g; p ← p − lr·v.
func sgdStep(params, velocity, grad []float32, lr, mu float32) {
	for i, g := range grad {
		v := mu*velocity[i] + g
		velocity[i] = v
		params[i] -= lr * v
	}
}

// evaluate classifies this rank's share of the test set and returns how
// many it got right out of how many.
func evaluate(m *mlp, ws *workspace, s *mnistdata.Split, rank, world int) (correct, total int) {
	from, to := rank*s.Len()/world, (rank+1)*s.Len()/world
	idx := make([]int, 0, ws.cap)
	for lo := from; lo < to; lo += ws.cap {
		idx = idx[:0]
		for i := lo; i < min(lo+ws.cap, to); i++ {
			idx = append(idx, i)
		}
		labels := s.Labels[lo : lo+len(idx)]
		loadBatch(ws.x, nil, s, idx)
		correct += m.countCorrect(ws, labels)
	}
	return correct, to - from
}

// compareWeights hashes params, gathers every rank's hash and reports whether
// they are all the same, with this rank's hash.
func compareWeights(ctx context.Context, c comm.Comm, params []float32) (agree bool, hash uint64, err error) {
	h := fnv.New64a()
	h.Write(comm.Host(params).HostBytes())
	hash = h.Sum64()
	mine := []int64{int64(hash)}
	all := make([]int64, c.Size())
	if err := c.AllGather(ctx, comm.Host(mine), comm.Host(all)); err != nil {
		return false, 0, fmt.Errorf("all-gather the weight hashes: %w", err)
	}
	for _, v := range all {
		if v != mine[0] {
			return false, hash, nil
		}
	}
	return true, hash, nil
}
