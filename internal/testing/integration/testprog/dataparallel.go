package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math"
	"os"
	"time"

	"github.com/gotrain/gotrain/gpu/cudadrv"
	"github.com/gotrain/gotrain/worker"
	"github.com/gotrain/gotrain/worker/comm"
	"github.com/gotrain/gotrain/worker/ncclcomm"
)

// dataParallelMode checks worker.DataParallel on device gradients (the NCCL
// backend) through an in-process recovery: each step every rank fills its
// gradients with (rank+1)·(step+1) on its compute stream, reduces them and
// checks that every element is the average over the ranks. In generation 0
// the victim dies after --pre steps while the others have started the
// next one (on the copy-engine transport their streams wait for its copy
// on the device, which only the abort of the communicator releases); the
// next generation restores the step count from a survivor and runs to
// --steps. Each rank prints per generation
//
//	DP rank=R generation=G transport=T
//	DP rank=R done steps=N
//
// With --hang-rank R, rank R stops calling DataParallel at step --hang-at
// (and --victim is ignored): the others wait for it inside their next
// reductions, on the GPU, which the hang detector must name.
func dataParallelMode(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("dataparallel", flag.ExitOnError)
	steps := fs.Int("steps", 30, "steps in all")
	pre := fs.Int("pre", 10, "of which generation 0 does")
	victim := fs.Int("victim", 1, "rank that dies in generation 0 (-1: none)")
	delay := fs.Duration("victim-delay", 200*time.Millisecond, "how long the victim waits after its last step before it dies")
	elements := fs.Int("elements", 3<<20+5, "float32 gradients (the buckets are 4 MiB)")
	transport := fs.String("transport", "auto", "auto, nccl or copy-engine")
	hangRank := fs.Int("hang-rank", -1, "rank that stops calling DataParallel at step --hang-at of generation 0 and sleeps (a hang for the detector); -1: none")
	hangAt := fs.Int("hang-at", 5, "the step at which --hang-rank stops")
	_ = fs.Parse(args)
	tr, err := worker.ParseTransport(*transport)
	if err != nil {
		return err
	}
	w, err := worker.Init(ctx)
	if err != nil {
		return err
	}
	defer w.Close()
	state := []float64{0} // steps done
	return w.Run(ctx, "dataparallel", func(ctx context.Context, g *worker.Generation) error {
		if err := g.Restore(ctx, worker.Host(state)); err != nil {
			return err
		}
		nc, ok := unwrapComm(g.Comm).(*ncclcomm.Comm)
		if !ok {
			return errors.New("dataparallel: needs --backend nccl")
		}
		t := &dpTrainer{nc: nc, n: *elements}
		if err := t.open(ctx, g, tr); err != nil {
			return err
		}
		defer t.close()
		fmt.Printf("DP rank=%d generation=%d transport=%s\n", g.Rank, g.Number, t.dp.Transport())
		victim := *victim
		if victim >= g.WorldSize || *hangRank >= 0 {
			victim = -1 // one rank: nothing to recover from
		}
		upTo := *steps
		if g.Number == 0 && victim >= 0 {
			upTo = *pre
		}
		for int(state[0]) < upTo {
			if g.Number == 0 && g.Rank == *hangRank && int(state[0]) == *hangAt {
				fmt.Printf("DP rank=%d stops at step %d pid=%d\n", g.Rank, *hangAt, os.Getpid())
				<-ctx.Done()
				return ctx.Err()
			}
			if err := t.step(ctx, g, int(state[0])); err != nil {
				return err
			}
			state[0]++
		}
		if g.Number > 0 || victim < 0 {
			fmt.Printf("DP rank=%d done steps=%g\n", g.Rank, state[0])
			return nil
		}
		if g.Rank == victim {
			time.Sleep(*delay)
			fmt.Fprintf(os.Stderr, "rank %d dies on purpose\n", g.Rank)
			os.Exit(1)
		}
		// Blocks (on the device) until the victim's death ends the generation.
		err := t.step(ctx, g, int(state[0]))
		return fmt.Errorf("generation 0 must not go on: %v", err)
	})
}

// unwrapComm returns the backend under package worker's wrappers (the
// flight recorder).
func unwrapComm(c worker.Comm) worker.Comm {
	for {
		u, ok := c.(comm.Unwrapper)
		if !ok {
			return c
		}
		c = u.Unwrap()
	}
}

// dpTrainer is one generation's gradients, compute stream and DataParallel.
type dpTrainer struct {
	nc     *ncclcomm.Comm
	n      int
	grads  cudadrv.DevicePtr
	stream cudadrv.Stream
	dp     *worker.DataParallel
}

func (t *dpTrainer) open(ctx context.Context, g *worker.Generation, tr worker.Transport) error {
	err := t.nc.Do(func() error {
		var err error
		if t.grads, err = cudadrv.MemAlloc(4 * t.n); err != nil {
			return err
		}
		t.stream, err = cudadrv.NewStream(cudadrv.StreamNonBlocking)
		return err
	})
	if err != nil {
		return err
	}
	// Three parameters of uneven sizes.
	sizes := []int{t.n / 2, t.n / 3, t.n - t.n/2 - t.n/3}
	t.dp, err = worker.NewDataParallel(ctx, g.Comm, sizes, comm.Device(uintptr(t.grads), t.n, comm.Float32),
		worker.DataParallelConfig{Stream: uintptr(t.stream), BucketBytes: 4 << 20, Transport: tr})
	return err
}

// step fills the gradients, reduces them and checks the average.
func (t *dpTrainer) step(ctx context.Context, g *worker.Generation, s int) error {
	v := func(rank int) float32 { return float32((rank + 1) * (s + 1)) }
	if err := t.nc.Do(func() error {
		return cudadrv.MemsetD32Async(t.grads, math.Float32bits(v(g.Rank)), t.n, t.stream)
	}); err != nil {
		return err
	}
	if err := t.dp.ReadyAll(ctx); err != nil {
		return err
	}
	if _, err := t.dp.Finish(ctx); err != nil {
		return err
	}
	got := make([]float32, t.n)
	if err := t.nc.Do(func() error {
		if err := t.stream.Synchronize(); err != nil {
			return err
		}
		return cudadrv.CopyFromDevice(got, t.grads)
	}); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err // the generation ended while the step ran: its values are void
	}
	var sum float32
	for r := range g.WorldSize {
		sum += v(r)
	}
	want := sum / float32(g.WorldSize)
	for i, x := range got {
		if x != want {
			return fmt.Errorf("dataparallel: rank %d step %d: gradient %d is %v, want %v", g.Rank, s, i, x, want)
		}
	}
	return nil
}

func (t *dpTrainer) close() {
	if t.dp != nil {
		t.dp.Close()
	}
	t.nc.Do(func() error {
		t.stream.Synchronize()
		t.stream.Destroy()
		return t.grads.Free()
	})
}
