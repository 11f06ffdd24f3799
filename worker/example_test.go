package worker_test

import (
	"context"
	"errors"
	"log"

	"github.com/gotrain/gotrain/worker"
	"github.com/gotrain/gotrain/worker/checkpoint"
)

// A training loop inside Run: the state lives outside train, so a rank
// that survives another's death keeps it and the restarted processes take
// it from the lowest survivor (g.Restore); when every process is new, the
// ranks agree on the newest state any of them finds (worker.Restore). It
// needs `gotrain launch` to run; examples/recover is the whole program.
func ExampleWorker_Run() {
	ctx := context.Background()
	w, err := worker.Init(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer w.Close()
	snaps, err := w.Snapshots(ctx) // nil (and no memory tier) where the agent offers none
	if err != nil {
		log.Print(err)
	}
	disk := checkpoint.Dir{Path: "/shared/ckpt"}

	step, params := []int64{0}, make([]float32, 1<<20)
	state := []worker.Buffer{worker.Host(step), worker.Host(params)}
	err = w.Run(ctx, "train", func(ctx context.Context, g *worker.Generation) error {
		if g.Source >= 0 {
			if err := g.Restore(ctx, state...); err != nil {
				return err
			}
		} else if _, err := worker.Restore(ctx, g.Comm, worker.Tiers{Snapshots: snaps, Disk: disk}, state...); err != nil && !errors.Is(err, worker.ErrNoState) {
			return err
		}
		for ; step[0] < 1000; step[0]++ {
			// ... forward, backward, g.Comm.AllReduce(ctx, grads, grads, worker.Avg), update params ...
			if snaps != nil {
				snaps.Save(step[0]+1, worker.Host([]int64{step[0] + 1}), worker.Host(params))
			}
		}
		return nil
	})
	if err != nil {
		log.Fatal(err)
	}
}

// At start, every rank restores the newest state any rank can find, into
// its own buffers: the same state on every rank after the call.
func ExampleRestore() {
	ctx := context.Background()
	w, err := worker.Init(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer w.Close()
	c, err := w.NewComm(ctx, "train")
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	snaps, err := w.Snapshots(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer snaps.Close()

	step, params := []int64{0}, make([]float32, 1<<20)
	r, err := worker.Restore(ctx, c, worker.Tiers{Snapshots: snaps, Disk: checkpoint.Dir{Path: "/shared/ckpt"}},
		worker.Host(step), worker.Host(params))
	switch {
	case errors.Is(err, worker.ErrNoState):
		log.Printf("rank %d: a fresh start, from rank 0's initial weights", w.Rank)
	case err != nil:
		log.Fatal(err)
	default:
		log.Printf("rank %d: resuming after step %d, from %s of rank %d", w.Rank, r.Step, r.Source, r.Rank)
	}
}
