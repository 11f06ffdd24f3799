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
	Memory stateTier
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
	start := time.Now()
	rank, world := c.Rank(), c.Size()

	n := ds.Train.Len()
	if cfg.Limit > 0 && cfg.Limit < n {
		n = cfg.Limit
	}
	// Every rank takes the same number of images, so that every rank runs the
	// same number of steps (and collectives); at most world-1 images go unused.
	shardLen := n / world
	if shardLen == 0 {
		return result{}, fmt.Errorf("%d training images cannot be shared by %d ranks (raise --limit)", n, world)
	}
	shardStart := rank * shardLen

	m := newMLP(mnistdata.Pixels, cfg.Hidden, mnistdata.Classes)
	m.initWeights(cfg.Seed)
	grad := make([]float32, len(m.params))
	velocity := make([]float32, len(m.params))
	// Every rank drew the same weights, or loaded the same checkpoint; rank
	// 0's copy is broadcast anyway, so that the ranks start identical even if
	// that ever stopped being true.
	st := trainState{Params: m.params, Velocity: velocity}
	from, err := restore(ctx, c, cfg.Memory, cfg.CheckpointDir, &st, out)
	if err != nil {
		return result{}, err
	}
	resumed := from != ""

	ws := m.newWorkspace(cfg.BatchSize)
	evalWS := m.newWorkspace(evalChunk)
	order := make([]int, shardLen)
	labels := make([]uint8, cfg.BatchSize)
	// stats is all-reduced once an epoch: loss sum and example count of the
	// training steps, then correct and total of the test evaluation.
	stats := make([]float64, 4)
	var res result
	stepsPerEpoch := (shardLen + cfg.BatchSize - 1) / cfg.BatchSize
	totalSteps, step := cfg.Epochs*stepsPerEpoch, st.Step
	res.Loss, res.TestAccuracy, res.Epochs = st.Loss, st.Accuracy, step/stepsPerEpoch
	if resumed && rank == 0 {
		fmt.Fprintf(out, "resumed at epoch %d step %d of %d (global step %d) from %s\n", step/stepsPerEpoch+1, step%stepsPerEpoch, stepsPerEpoch, step, from)
	}
	save := func() error {
		if rank != 0 || cfg.CheckpointDir == "" {
			return nil
		}
		s := trainState{Step: step, Loss: res.Loss, Accuracy: res.TestAccuracy, Params: m.params, Velocity: velocity}
		return checkpoint.Dir{Path: cfg.CheckpointDir}.Save(int64(step), s.encode())
	}

	stepStart := time.Now() // for the samples per second ReportStep gets
	if cfg.ReportStep != nil {
		cfg.ReportStep(int64(step), 0)
	}
	for epoch := step/stepsPerEpoch + 1; epoch <= cfg.Epochs; epoch++ {
		skip := (step % stepsPerEpoch) * cfg.BatchSize // steps of this epoch taken before a resume
		// The same seed on every rank; each permutes its own shard.
		rng := rand.New(rand.NewPCG(cfg.Seed, uint64(epoch)))
		for i := range order {
			order[i] = shardStart + i
		}
		rng.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })

		var lossSum float64
		for from := skip; from < shardLen; from += cfg.BatchSize {
			batch := order[from:min(from+cfg.BatchSize, shardLen)]
			loadBatch(ws.x, labels, &ds.Train, batch)
			loss := m.lossAndGrad(ws, labels[:len(batch)], grad)
			lossSum += loss * float64(len(batch))
			g := comm.Host(grad)
			if err := c.AllReduce(ctx, g, g, comm.Avg); err != nil {
				return result{}, fmt.Errorf("epoch %d: all-reduce the gradients: %w", epoch, err)
			}
			lr := cosineLR(cfg.LR, step, totalSteps)
			sgdStep(m.params, velocity, grad, float32(lr), float32(cfg.Momentum))
			step++
			if cfg.Memory != nil {
				s := trainState{Step: step, Loss: res.Loss, Accuracy: res.TestAccuracy, Params: m.params}
				cfg.Memory.SaveBytes(int64(step), s.header(), comm.Host(m.params).HostBytes(), comm.Host(velocity).HostBytes())
				if step == cfg.DieAtStep && rank == cfg.DieRank && cfg.FirstAttempt {
					// This step's snapshot was skipped if the previous
					// hand-over was still in flight: save it now.
					if err := cfg.Memory.Wait(ctx); err != nil {
						return result{}, err
					}
					cfg.Memory.SaveBytes(int64(step), s.header(), comm.Host(m.params).HostBytes(), comm.Host(velocity).HostBytes())
					if err := cfg.Memory.Wait(ctx); err != nil {
						return result{}, err
					}
					if cfg.DieHang {
						fmt.Fprintf(out, "waiting at step %d for the node to be killed\n", step)
						<-ctx.Done()
						return result{}, ctx.Err()
					}
					fmt.Fprintf(out, "dying at step %d: SIGKILL\n", step)
					_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
				}
			}
			if cfg.ReportStep != nil {
				now := time.Now()
				cfg.ReportStep(int64(step), float64(len(batch)*world)/now.Sub(stepStart).Seconds())
				stepStart = now
			}
			// A step that ends the epoch is saved after the evaluation.
			if cfg.CheckpointEvery > 0 && step%cfg.CheckpointEvery == 0 && step%stepsPerEpoch != 0 {
				if err := save(); err != nil {
					return result{}, err
				}
			}
		}

		correct, total := evaluate(m, evalWS, &ds.Test, rank, world)
		stats[0], stats[1], stats[2], stats[3] = lossSum, float64(shardLen), float64(correct), float64(total)
		s := comm.Host(stats)
		if err := c.AllReduce(ctx, s, s, comm.Sum); err != nil {
			return result{}, fmt.Errorf("epoch %d: all-reduce the loss and accuracy: %w", epoch, err)
		}
		res.Epochs = epoch
		res.Loss = stats[0] / stats[1]
		res.TestAccuracy = stats[2] / stats[3]
		if rank == 0 {
			fmt.Fprintf(out, "epoch=%d loss=%.4f test_accuracy=%s elapsed=%.1fs\n",
				epoch, res.Loss, formatAccuracy(res.TestAccuracy), time.Since(start).Seconds())
		}
		if err := save(); err != nil {
			return result{}, err
		}
	}

	agree, hash, err := compareWeights(ctx, c, m.params)
	if err != nil {
		return result{}, err
	}
	res.WeightHash, res.RanksAgree = hash, agree
	res.Elapsed = time.Since(start)
	if rank == 0 && cfg.PrintWeights {
		fmt.Fprintf(out, "weights fnv64a=%016x\n", hash)
	}
	if rank == 0 {
		fmt.Fprintf(out, "final test_accuracy=%s ranks_agree=%t\n", formatAccuracy(res.TestAccuracy), res.RanksAgree)
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
