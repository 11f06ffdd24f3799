package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/gotrain/gotrain/worker"
)

// restartMode measures and checks restarts. In the job's first attempt,
// rank --victim dies (exit 1) after the first all-reduce and --delay,
// writing the time of death to --mark first; the others block in a second
// all-reduce. In the next generation every rank prints how long after the
// death its first all-reduce of the generation completed:
//
//	RESTART rank=R generation=G pid=P survivor=S recovered_in=SECONDS
//
// With --inprocess the ranks run in worker.Run: survivors recover in
// process, and --steps more all-reduces check that every rank ends with the
// same value, restored from a survivor.
func restartMode(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("restart", flag.ExitOnError)
	mark := fs.String("mark", "", "file for the time of death (required)")
	victim := fs.Int("victim", 1, "rank that dies in the first generation")
	delay := fs.Duration("delay", time.Second, "how long the victim waits after the first all-reduce")
	inprocess := fs.Bool("inprocess", false, "recover in process (worker.Run)")
	size := fs.Int("size", 1<<20, "float32 elements per all-reduce")
	steps := fs.Int("steps", 20, "all-reduces of the state in all (with --inprocess)")
	pre := fs.Int("pre", 5, "of which the first generation does (with --inprocess)")
	_ = fs.Parse(args)
	if *mark == "" {
		return errors.New("restart: --mark is required")
	}
	tMain := time.Now()
	w, err := worker.Init(ctx)
	if err != nil {
		return err
	}
	tInit := time.Now()
	var tComm time.Time // the generation's communicator is ready
	defer w.Close()
	x := make([]float32, *size)
	die := func() {
		time.Sleep(*delay)
		now := strconv.FormatInt(time.Now().UnixNano(), 10)
		if err := os.WriteFile(*mark+".tmp", []byte(now), 0o644); err == nil {
			_ = os.Rename(*mark+".tmp", *mark)
		}
		fmt.Fprintf(os.Stderr, "rank %d dies on purpose\n", w.Rank)
		os.Exit(1)
	}
	recovered := func(gen int64, survivor bool) error {
		b, err := os.ReadFile(*mark)
		if err != nil {
			return err
		}
		t0, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
		if err != nil {
			return err
		}
		death := time.Unix(0, t0)
		fmt.Printf("RESTART rank=%d generation=%d pid=%d survivor=%t recovered_in=%.3f\n",
			w.Rank, gen, os.Getpid(), survivor, time.Since(death).Seconds())
		// Where the time went, from the death: process start, worker.Init
		// done, communicator ready (negative: before the death).
		fmt.Printf("BREAKDOWN rank=%d survivor=%t main=%+.3f init=%+.3f comm=%+.3f\n",
			w.Rank, survivor, tMain.Sub(death).Seconds(), tInit.Sub(death).Seconds(), tComm.Sub(death).Seconds())
		return nil
	}

	if !*inprocess {
		c, err := w.NewComm(ctx, "restart")
		if err != nil {
			return err
		}
		defer c.Close()
		tComm = time.Now()
		if err := c.AllReduce(ctx, worker.Host(x), worker.Host(x), worker.Sum); err != nil {
			return err
		}
		if w.RestartCount > 0 {
			return recovered(w.Generation, false)
		}
		if w.Rank == *victim {
			die()
		}
		_ = c.AllReduce(ctx, worker.Host(x), worker.Host(x), worker.Sum)
		select {} // stopped by the agent
	}

	// In process: state is (steps done, value); every rank must end equal.
	state := []float64{0, 1}
	run := func(ctx context.Context, c worker.Comm, upTo int) error {
		v := []float64{0}
		for int(state[0]) < upTo {
			v[0] = state[1] + float64(c.Rank()) // differs by rank: the average is the check
			if err := c.AllReduce(ctx, worker.Host(v), worker.Host(v), worker.Avg); err != nil {
				return err
			}
			state[0], state[1] = state[0]+1, v[0]*1.5+1
		}
		return nil
	}
	return w.Run(ctx, "restart", func(ctx context.Context, g *worker.Generation) error {
		tComm = time.Now()
		if err := g.Restore(ctx, worker.Host(state)); err != nil {
			return err
		}
		if err := g.Comm.AllReduce(ctx, worker.Host(x), worker.Host(x), worker.Sum); err != nil {
			return err
		}
		if g.Number > 0 {
			if err := recovered(g.Number, g.Survivor); err != nil {
				return err
			}
			fmt.Printf("rank %d generation %d source %d restored step %g\n", g.Rank, g.Number, g.Source, state[0])
		} else {
			fmt.Printf("rank %d generation 0 pid %d\n", g.Rank, os.Getpid())
			if err := run(ctx, g.Comm, *pre); err != nil {
				return err
			}
			if g.Rank == *victim {
				die()
			}
			// Blocks until the victim's death breaks the generation.
			err := g.Comm.AllReduce(ctx, worker.Host(x), worker.Host(x), worker.Sum)
			return fmt.Errorf("generation 0 must not go on: %v", err)
		}
		if err := run(ctx, g.Comm, *steps); err != nil {
			return err
		}
		fmt.Printf("rank %d done steps=%g value=%g\n", g.Rank, state[0], state[1])
		return nil
	})
}
