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
	o := parseHangFlags(args)
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
	buf := make([]float32, o.count+1)
	for step := 1; step <= o.steps; step++ {
		time.Sleep(o.compute(w, step))
		n := o.count
		if w.Rank == o.faultRank && step == o.faultStep && o.fault != "none" {
			var skip bool
			if n, skip, err = o.injectFault(ctx, c, buf, w.Rank, step); err != nil {
				return err
			}
			if skip {
				continue
			}
		}
		if err := c.AllReduce(ctx, worker.Host(buf[:n]), worker.Host(buf[:n]), worker.Sum); err != nil {
			return fmt.Errorf("step %d: %w", step, err)
		}
		w.ReportStep(int64(step), 0)
		if o.stepLines {
			fmt.Printf("STEP rank %d gen %d seq %d unix_ms %d\n", w.Rank, w.Generation, step, time.Now().UnixMilli())
		}
	}
	fmt.Printf("hang ok: %d steps\n", o.steps)
	return nil
}

// hangOptions are hang's flags.
type hangOptions struct {
	fault                                  string
	faultRank, faultStep, steps, count     int
	stepTime, slowStep, jitter             time.Duration
	slowRank, slowFrom, slowEvery, slowFor int
	slowGen                                int64
	stepLines                              bool
}

func parseHangFlags(args []string) hangOptions {
	var o hangOptions
	fs := flag.NewFlagSet("hang", flag.ExitOnError)
	fs.StringVar(&o.fault, "fault", "none", "skip, op, count, stop, spin or none")
	fs.IntVar(&o.faultRank, "fault-rank", 1, "the rank that misbehaves")
	fs.IntVar(&o.faultStep, "fault-step", 3, "the step (collective seq) at which it does")
	fs.IntVar(&o.steps, "steps", 1000, "steps to run")
	fs.DurationVar(&o.stepTime, "step-time", 200*time.Millisecond, "compute time per step")
	fs.IntVar(&o.count, "count", 1024, "floats per all-reduce")
	fs.IntVar(&o.slowRank, "slow-rank", -1, "the rank that becomes a straggler (-1: none)")
	fs.IntVar(&o.slowFrom, "slow-from", 10, "the step from which it is slow")
	fs.DurationVar(&o.slowStep, "slow-step-time", time.Second, "its compute time per step once slow")
	fs.Int64Var(&o.slowGen, "slow-generation", -1, "with --slow-rank: slow only in this generation (-1: in every one)")
	fs.DurationVar(&o.jitter, "jitter", 0, "a random extra compute time per step, up to this")
	fs.IntVar(&o.slowEvery, "slow-every", 0, "repeat injections: a period of this many steps, the slow rank rotating (0: one injection)")
	fs.IntVar(&o.slowFor, "slow-for", 20, "with --slow-every, the slow steps at the start of each period")
	fs.BoolVar(&o.stepLines, "step-lines", false, `print "STEP rank R gen G seq K unix_ms T" after every step (step rates from the output)`)
	_ = fs.Parse(args)
	return o
}

// compute is this rank's compute time of step (printing SLOW and FAST
// where it changes).
func (o hangOptions) compute(w *worker.Worker, step int) time.Duration {
	compute := o.stepTime
	if n := o.slowEvery; n > 0 {
		period, pos := step/n, step%n
		if period >= 1 && w.Rank == period%w.WorldSize {
			switch {
			case pos == 0:
				fmt.Printf("SLOW rank %d seq %d unix_ms %d\n", w.Rank, step, time.Now().UnixMilli())
			case pos == o.slowFor:
				fmt.Printf("FAST rank %d seq %d unix_ms %d\n", w.Rank, step, time.Now().UnixMilli())
			}
			if pos < o.slowFor {
				compute = o.slowStep
			}
		}
	} else if w.Rank == o.slowRank && step >= o.slowFrom && (o.slowGen < 0 || w.Generation == o.slowGen) {
		if step == o.slowFrom {
			fmt.Printf("SLOW rank %d seq %d unix_ms %d\n", w.Rank, step, time.Now().UnixMilli())
		}
		compute = o.slowStep
	}
	if o.jitter > 0 {
		compute += rand.N(o.jitter)
	}
	return compute
}

// injectFault misbehaves at the fault step: it returns the floats of the
// step's all-reduce, or skip when the step has no all-reduce.
func (o hangOptions) injectFault(ctx context.Context, c worker.Comm, buf []float32, rank, step int) (n int, skip bool, err error) {
	n = o.count
	fmt.Printf("FAULT %s rank %d seq %d unix_ms %d\n", o.fault, rank, step, time.Now().UnixMilli())
	switch o.fault {
	case "skip":
		otherWork()
	case "op":
		all := make([]float32, n*c.Size())
		if err := c.AllGather(ctx, worker.Host(buf[:n]), worker.Host(all)); err != nil {
			return 0, false, fmt.Errorf("step %d: %w", step, err)
		}
		return n, true, nil
	case "count":
		n++
	case "stop":
		if err := stopSelf(); err != nil {
			return 0, false, err
		}
	case "spin":
		spin()
	default:
		return 0, false, fmt.Errorf("unknown fault %q", o.fault)
	}
	return n, false, nil
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
