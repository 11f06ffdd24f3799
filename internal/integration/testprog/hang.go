package main

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"syscall"
	"time"

	"github.com/gotrain/gotrain/worker"
)

// hangMode is a training loop: each step computes (sleeps --step-time), then
// all-reduces --count floats on communicator "hang", so step K is collective
// #K. At step --fault-step, rank --fault-rank misbehaves:
//
//	skip   skips the all-reduce and waits in other code
//	op     calls AllGather where the others call AllReduce
//	count  passes another count
//	stop   stops itself with SIGSTOP before the all-reduce
//	spin   spins on the CPU before the all-reduce, forever
//	none   nothing: a healthy job
//
// It prints "FAULT <kind> rank R seq K unix_ms T" when the fault happens.
//
// With --slow-rank R, rank R computes --slow-step-time instead of
// --step-time from step --slow-from on (a straggler), and prints "SLOW rank R
// seq K unix_ms T" when it starts to; with --slow-generation G only in
// generation G (its first incarnation, for --on-straggler replace); --jitter adds a random 0 to D to every
// rank's compute of every step. With --slow-every N (a benchmark of many
// injections), rank (s/N) mod size is slow during steps s with s mod N <
// --slow-for, from the second period on, and prints SLOW and then "FAST rank
// R seq K unix_ms T" when it is fast again.
func hangMode(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("hang", flag.ExitOnError)
	fault := fs.String("fault", "none", "skip, op, count, stop, spin or none")
	faultRank := fs.Int("fault-rank", 1, "the rank that misbehaves")
	faultStep := fs.Int("fault-step", 3, "the step (collective seq) at which it does")
	steps := fs.Int("steps", 1000, "steps to run")
	stepTime := fs.Duration("step-time", 200*time.Millisecond, "compute time per step")
	count := fs.Int("count", 1024, "floats per all-reduce")
	slowRank := fs.Int("slow-rank", -1, "the rank that becomes a straggler (-1: none)")
	slowFrom := fs.Int("slow-from", 10, "the step from which it is slow")
	slowStep := fs.Duration("slow-step-time", time.Second, "its compute time per step once slow")
	slowGen := fs.Int64("slow-generation", -1, "with --slow-rank: slow only in this generation (-1: in every one)")
	jitter := fs.Duration("jitter", 0, "a random extra compute time per step, up to this")
	slowEvery := fs.Int("slow-every", 0, "repeat injections: a period of this many steps, the slow rank rotating (0: one injection)")
	slowFor := fs.Int("slow-for", 20, "with --slow-every, the slow steps at the start of each period")
	stepLines := fs.Bool("step-lines", false, `print "STEP rank R gen G seq K unix_ms T" after every step (step rates from the output)`)
	_ = fs.Parse(args)
	w, err := worker.Init(ctx)
	if err != nil {
		return err
	}
	defer w.Close()
	c, err := w.NewComm(ctx, "hang")
	if err != nil {
		return err
	}
	defer c.Close()
	buf := make([]float32, *count+1)
	for step := 1; step <= *steps; step++ {
		compute := *stepTime
		if n := *slowEvery; n > 0 {
			period, pos := step/n, step%n
			if period >= 1 && w.Rank == period%w.WorldSize {
				switch {
				case pos == 0:
					fmt.Printf("SLOW rank %d seq %d unix_ms %d\n", w.Rank, step, time.Now().UnixMilli())
				case pos == *slowFor:
					fmt.Printf("FAST rank %d seq %d unix_ms %d\n", w.Rank, step, time.Now().UnixMilli())
				}
				if pos < *slowFor {
					compute = *slowStep
				}
			}
		} else if w.Rank == *slowRank && step >= *slowFrom && (*slowGen < 0 || w.Generation == *slowGen) {
			if step == *slowFrom {
				fmt.Printf("SLOW rank %d seq %d unix_ms %d\n", w.Rank, step, time.Now().UnixMilli())
			}
			compute = *slowStep
		}
		if *jitter > 0 {
			compute += rand.N(*jitter)
		}
		time.Sleep(compute)
		n := *count
		if w.Rank == *faultRank && step == *faultStep && *fault != "none" {
			fmt.Printf("FAULT %s rank %d seq %d unix_ms %d\n", *fault, w.Rank, step, time.Now().UnixMilli())
			switch *fault {
			case "skip":
				otherWork()
			case "op":
				all := make([]float32, n*c.Size())
				if err := c.AllGather(ctx, worker.Host(buf[:n]), worker.Host(all)); err != nil {
					return fmt.Errorf("step %d: %w", step, err)
				}
				continue
			case "count":
				n++
			case "stop":
				if err := stopSelf(); err != nil {
					return err
				}
			case "spin":
				spin()
			default:
				return fmt.Errorf("unknown fault %q", *fault)
			}
		}
		if err := c.AllReduce(ctx, worker.Host(buf[:n]), worker.Host(buf[:n]), worker.Sum); err != nil {
			return fmt.Errorf("step %d: %w", step, err)
		}
		w.ReportStep(int64(step), 0)
		if *stepLines {
			fmt.Printf("STEP rank %d gen %d seq %d unix_ms %d\n", w.Rank, w.Generation, step, time.Now().UnixMilli())
		}
	}
	fmt.Printf("hang ok: %d steps\n", *steps)
	return nil
}

// stopSelf stops the process with SIGSTOP before it returns. A signal sent
// to the process (kill(getpid())) goes to whichever thread the kernel picks,
// often the main thread, and the calling thread runs on until that one has
// been scheduled and started the group stop: on a loaded machine long
// enough to finish the next collective. Sent to the calling thread itself
// (tgkill), the stop is taken on the way back from the system call.
func stopSelf() error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	return syscall.Tgkill(os.Getpid(), syscall.Gettid(), syscall.SIGSTOP)
}

// otherWork stands for code that waits on something else than the collective.
//
//go:noinline
func otherWork() { time.Sleep(time.Hour) }

// spin burns a CPU forever.
//
//go:noinline
func spin() {
	x := 0
	for {
		x++
	}
}
