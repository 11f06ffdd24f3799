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

	"golang.org/x/sys/unix"

	"github.com/gotrain/gotrain/worker"
	"github.com/gotrain/gotrain/worker/ncclcomm"
)

// restartMode measures and checks restarts. In the job's first attempt,
// rank --victim dies (exit 1) after the first all-reduce and --delay,
// writing the time of death to --mark first; the others block in a second
// all-reduce. In the next generation every rank prints how long after the
// death its first all-reduce of the generation completed:
//
//	RESTART rank=R generation=G pid=P survivor=S recovered_in=SECONDS
//
// and a TIMING line of wall-clock times (unix ns, 0 for a step not taken)
// of the steps between: see timingLine, and the job's variables in its
// environment as the generation sees them (the same on every rank, however
// its process came to be: started, standby or survivor):
//
//	ENV rank=R GOTRAIN_GENERATION=G GOTRAIN_RESTART_COUNT=N ... (jobVars)
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
	awaitKill := fs.Bool("await-kill", false, "the victim prints \"victim rank=R pid=P\" and waits to be killed instead of dying; the killer writes --mark")
	_ = fs.Parse(args)
	if *mark == "" {
		return errors.New("restart: --mark is required")
	}
	tMain := time.Now()
	tSpawn := processStart()
	w, err := worker.Init(ctx)
	if err != nil {
		return err
	}
	tInit := time.Now()
	var tComm time.Time // the generation's communicator is ready
	var gc worker.Comm  // the generation's communicator, for its timings
	var rt worker.RecoveryTimes
	defer w.Close()
	x := make([]float32, *size)
	die := func() {
		if *awaitKill {
			fmt.Printf("victim rank=%d pid=%d\n", w.Rank, os.Getpid())
			select {}
		}
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
		tFirst := time.Now()
		fmt.Println(timingLine(w.Rank, gen, survivor, death, tSpawn, tMain, tInit, tComm, tFirst, gc, rt))
		fmt.Printf("RESTART rank=%d generation=%d pid=%d survivor=%t recovered_in=%.3f\n",
			w.Rank, gen, os.Getpid(), survivor, time.Since(death).Seconds())
		fmt.Printf("ENV rank=%d %s\n", w.Rank, jobVars())
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
		tComm, gc = time.Now(), c
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
		tComm, gc, rt = time.Now(), g.Comm, g.Recovery
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

// timingLine is the TIMING line of a rank in the new generation: the time of
// death, then each step in order (unix ns; 0: not taken):
//
//	spawn       the process was created (/proc/self/stat, 10 ms resolution)
//	main        main ran
//	init        worker.Init returned (the NCCL backend's prewarm started in it)
//	ended, aborted, handed
//	            survivors of in-process recovery: the agent said the
//	            generation ended; the old communicator was aborted and closed;
//	            the agent handed the new generation over
//	warm_start, warm_driver, warm_ctx
//	            ncclcomm.Prewarm: started, cuInit done, primary context retained
//	warm_comm   ncclcomm.PrewarmComm (standbys): the one-rank communicator done
//	comm_start  NewComm called; then driver and nccl loaded, unique id in
//	            hand (id), the comm's thread set up (ctx), the non-blocking
//	            init done (boot), the split done (split), NewComm returns
//	            (comm_ready)
//	comm        worker.NewComm returned (any backend)
//	first       the first collective of the generation completed
func timingLine(rank int, gen int64, survivor bool, death, spawn, main, init, commDone, first time.Time, c worker.Comm, rt worker.RecoveryTimes) string {
	var nt ncclcomm.Timings
	if tc, ok := unwrapComm(c).(interface{ Timings() ncclcomm.Timings }); ok {
		nt = tc.Timings()
	}
	ns := func(t time.Time) int64 {
		if t.IsZero() {
			return 0
		}
		return t.UnixNano()
	}
	var b strings.Builder
	fmt.Fprintf(&b, "TIMING rank=%d generation=%d survivor=%t", rank, gen, survivor)
	for _, f := range []struct {
		k string
		t time.Time
	}{
		{"death", death}, {"spawn", spawn}, {"main", main}, {"init", init},
		{"ended", rt.Ended}, {"aborted", rt.Aborted}, {"handed", rt.Started},
		{"warm_start", nt.WarmStart}, {"warm_driver", nt.WarmDriver}, {"warm_ctx", nt.WarmContext}, {"warm_comm", nt.WarmComm},
		{"comm_start", nt.Start}, {"driver", nt.Driver}, {"nccl", nt.NCCL}, {"id", nt.ID}, {"ctx", nt.Context},
		{"boot", nt.Init}, {"split", nt.Split}, {"comm_ready", nt.Ready},
		{"comm", commDone}, {"first", first},
	} {
		fmt.Fprintf(&b, " %s=%d", f.k, ns(f.t))
	}
	return b.String()
}

// processStart returns when this process was created, from its start time
// in /proc/self/stat (clock ticks since boot) and the boot-time clock; zero
// where that cannot be read.
func processStart() time.Time {
	b, err := os.ReadFile("/proc/self/stat")
	if err != nil {
		return time.Time{}
	}
	// The command name (field 2) may hold spaces; fields count from after it.
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return time.Time{}
	}
	f := strings.Fields(string(b[i+1:]))
	const startField = 22 - 3 // starttime is field 22; f[0] is field 3
	if len(f) <= startField {
		return time.Time{}
	}
	ticks, err := strconv.ParseInt(f[startField], 10, 64)
	if err != nil {
		return time.Time{}
	}
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts); err != nil {
		return time.Time{}
	}
	const clkTck = 100 // USER_HZ on Linux
	age := time.Duration(ts.Nano()) - time.Duration(ticks)*time.Second/clkTck
	return time.Now().Add(-age)
}

// jobVars lists the job-wide variables of this process's environment that
// change with the generation, in a fixed order.
func jobVars() string {
	var b strings.Builder
	for i, k := range []string{"GOTRAIN_GENERATION", "GOTRAIN_RESTART_COUNT", "GOTRAIN_WORLD_SIZE", "GOTRAIN_LOCAL_WORLD_SIZE",
		"TORCHELASTIC_RESTART_COUNT", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "GOTRAIN_STANDBY"} {
		if i > 0 {
			b.WriteByte(' ')
		}
		fmt.Fprintf(&b, "%s=%s", k, os.Getenv(k))
	}
	return b.String()
}
