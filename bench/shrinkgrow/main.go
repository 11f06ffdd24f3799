// Command shrinkgrow measures recovering an NCCL communicator from a dead
// rank without a new one: the survivors revoke (or abortively shrink) it and
// ncclCommShrink it to themselves, then ncclCommGrow brings a replacement
// back in; against today's way, a new unique id and ncclCommInitRank of
// every rank (or, as worker/ncclcomm does, a non-blocking init and a split).
//
// Its ranks are goroutines of one process, each on a locked OS thread with
// the device's primary context current and a stream of its own, all on one
// GPU (NCCL ≥ 2.30 with NCCL_MULTI_RANK_GPU_ENABLE=1, which it sets when
// unset, with NCCL_MAX_CTAS=16/ranks). Each cycle: rank v = cycle mod N
// "dies" (it stops taking part; its communicator is aborted once the
// survivors' kernels are stopped, since in one process the survivors point
// straight at its buffers), the survivors have an all-reduce in flight that
// waits for it, recovery runs, and an all-reduce of the new world is
// checked for the exact sum. A phase that outlives -cycle-timeout is a
// hang: the program names it and exits 3, it does not stall.
//
// Each new communicator's first collective (the checked all-reduce) is
// launched for every rank by one thread in one NCCL group (-launch group):
// launched by each rank's own thread (-launch threads), the first
// all-reduce of a new world hung in 5 of 15 runs on the H200, against 0 of
// 15 grouped (bench/results/shrink-grow-2026-12-02-s3.md).
//
// Aborts and destroys run in the background, off recovery's path, as
// worker/ncclcomm does; the benchmark waits for them (bg-wait) before the
// next all-reduce. Without that wait, 3 of 4 configurations hung on the
// H200 (a launch or an all-reduce never returned while an earlier
// cycle's abort ran): in one process, an abort's synchronisation next to
// kernels that wait for a peer is the likely cause; with one process per
// rank, as gotrain runs them, the abort is in another context.
//
//	go build -o bin/shrinkgrow ./bench/shrinkgrow
//	GOTRAIN_NCCL_LIBRARY=/path/libnccl.so.2 bin/shrinkgrow -mode shrink -ranks 4 -cycles 200
//	GOTRAIN_NCCL_LIBRARY=/path/libnccl.so.2 bin/shrinkgrow -mode reinit -ranks 4 -cycles 200
//
// It prints p50/p99/max per phase and a RESULT line: PASS when every cycle
// ran, none hung and every sum was exact. Exit status 1 for a wrong sum or
// an error, 2 for bad flags or a missing GPU or NCCL, 3 for a hang.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/gotrain/gotrain/gpu/cudadrv"
	"github.com/gotrain/gotrain/nccl"
)

type options struct {
	mode         string // shrink, reinit, reinit-split
	how          string // revoke, abort, revoke+abort: how the survivors stop the old communicator before Shrink
	ranks        int
	cycles       int
	count        int
	inflight     bool
	cycleTimeout time.Duration
	budget       time.Duration
	growRoot     int
	launch       string // group or threads: how the checked all-reduces are launched
	csv          string
}

func main() {
	var o options
	flag.StringVar(&o.mode, "mode", "shrink", "shrink (revoke/abort + ncclCommShrink, then ncclCommGrow), reinit (abort + new id + ncclCommInitRank) or reinit-split (abort + non-blocking ncclCommInitRankConfig + ncclCommSplit, as worker/ncclcomm)")
	flag.StringVar(&o.how, "how", "revoke", "mode shrink: revoke (ncclCommRevoke, then NCCL_SHRINK_DEFAULT), abort (NCCL_SHRINK_ABORT alone) or revoke+abort")
	flag.IntVar(&o.ranks, "ranks", 4, "ranks of the world, all on GPU 0")
	flag.IntVar(&o.cycles, "cycles", 200, "failure and recovery cycles")
	flag.IntVar(&o.count, "count", 1<<16, "float32 elements of the checked all-reduce")
	flag.BoolVar(&o.inflight, "inflight", true, "survivors have an all-reduce in flight that waits for the dead rank")
	flag.DurationVar(&o.cycleTimeout, "cycle-timeout", 30*time.Second, "a phase (or a background abort) that takes longer is a hang: exit 3")
	flag.DurationVar(&o.budget, "budget", 0, "stop starting cycles after this long (0: none); fewer cycles than -cycles is then a FAIL")
	flag.IntVar(&o.growRoot, "grow-root", 0, "mode shrink: the shrunk rank that calls ncclCommGetUniqueId")
	flag.StringVar(&o.launch, "launch", "group", "how the checked all-reduce (each new communicator's first collective) is launched: group (one thread, every rank in one NCCL group) or threads (each rank's own thread)")
	flag.StringVar(&o.csv, "csv", "", "write every cycle's phase times (ms) here")
	flag.Parse()
	if err := o.check(); err != nil {
		fmt.Fprintln(os.Stderr, "shrinkgrow:", err)
		os.Exit(2)
	}
	os.Exit(run(o))
}

func (o *options) check() error {
	switch o.mode {
	case "shrink", "reinit", "reinit-split":
	default:
		return fmt.Errorf("-mode %q: want shrink, reinit or reinit-split", o.mode)
	}
	switch o.how {
	case "revoke", "abort", "revoke+abort":
	default:
		return fmt.Errorf("-how %q: want revoke, abort or revoke+abort", o.how)
	}
	switch o.launch {
	case "group", "threads":
	default:
		return fmt.Errorf("-launch %q: want group or threads", o.launch)
	}
	if o.ranks < 3 {
		return fmt.Errorf("-ranks %d: want at least 3 (a shrunk world of at least 2)", o.ranks)
	}
	if o.cycles < 1 || o.count < 1 {
		return fmt.Errorf("-cycles and -count must be positive")
	}
	if o.growRoot < 0 || o.growRoot >= o.ranks-1 {
		return fmt.Errorf("-grow-root %d: want a rank of the shrunk world, 0 to %d", o.growRoot, o.ranks-2)
	}
	return nil
}

// worker is one rank's thread; which rank it is changes every cycle.
type worker struct {
	id               int
	work             chan func()
	stream           cudadrv.Stream
	send, recv, hang cudadrv.DevicePtr
	host             []float32
	comm             *nccl.Comm
}

func (w *worker) do(f func() error) <-chan error {
	done := make(chan error, 1)
	w.work <- func() { done <- f() }
	return done
}

type bench struct {
	o       options
	lib     *nccl.Library
	workers []*worker // in rank order of the current world
	stats   *stats
	cycle   int
	bg      *background
	last    time.Duration // the last phase's wall time
}

func run(o options) int {
	setDefaultEnv(o.ranks)
	drv, err := cudadrv.Load()
	if err != nil {
		fmt.Fprintln(os.Stderr, "shrinkgrow: needs the CUDA driver and a GPU:", err)
		return 2
	}
	lib, err := nccl.Load()
	if err != nil {
		fmt.Fprintln(os.Stderr, "shrinkgrow:", err)
		return 2
	}
	dev, err := drv.Device(0)
	if err != nil {
		fmt.Fprintln(os.Stderr, "shrinkgrow: GPU 0:", err)
		return 2
	}
	name, _ := dev.Name()
	desc := o.adaptMode(lib)
	fmt.Printf("# shrinkgrow: %d ranks as threads of one process on GPU 0 (%s), NCCL %s (%s), CUDA driver %s\n",
		o.ranks, name, lib.Version(), lib.Path(), drv.VersionString())
	fmt.Printf("# mode %s; %d cycles; in-flight all-reduce at the failure: %v; checked all-reduce of %d float32, launched by %s; cycle timeout %v\n",
		desc, o.cycles, o.inflight, o.count, o.launch, o.cycleTimeout)
	fmt.Printf("# env: NCCL_MULTI_RANK_GPU_ENABLE=%s NCCL_MAX_CTAS=%s NCCL_NVLS_ENABLE=%s NCCL_RUNTIME_CONNECT=%s NCCL_CUMEM_ENABLE=%q\n",
		os.Getenv("NCCL_MULTI_RANK_GPU_ENABLE"), os.Getenv("NCCL_MAX_CTAS"), os.Getenv("NCCL_NVLS_ENABLE"), os.Getenv("NCCL_RUNTIME_CONNECT"), os.Getenv("NCCL_CUMEM_ENABLE"))

	st := newStats()
	b := &bench{o: o, lib: lib, stats: st, bg: &background{timeout: o.cycleTimeout, stats: st}}
	for i := range o.ranks {
		w, err := startWorker(dev, i, o.count)
		if err != nil {
			fmt.Fprintf(os.Stderr, "shrinkgrow: rank thread %d: %v\n", i, err)
			return 2
		}
		b.workers = append(b.workers, w)
	}
	if err := b.initWorld(); err != nil {
		fmt.Fprintln(os.Stderr, "shrinkgrow: first init:", err)
		return 1
	}
	start := time.Now()
	failed := b.runCycles(start)
	done := b.cycle
	if err := b.bg.wait(); err != nil && failed == nil {
		failed = err
	}
	return b.report(failed, done, start, desc)
}

// adaptMode falls back from shrink to re-init, and from revoke to abort,
// where this NCCL lacks the calls, saying so; it returns the mode's
// description.
func (o *options) adaptMode(lib *nccl.Library) string {
	mode := o.mode
	if mode == "shrink" {
		for _, f := range []string{"ncclCommShrink", "ncclCommGetUniqueId", "ncclCommGrow"} {
			if !lib.Has(f) {
				fmt.Printf("# NCCL %s has no %s (needs %s): falling back to re-init with a new id\n", lib.Version(), f, nccl.Since[f])
				mode = "reinit"
				break
			}
		}
		if mode == "shrink" && strings.Contains(o.how, "revoke") && !lib.Has("ncclCommRevoke") {
			fmt.Printf("# NCCL %s has no ncclCommRevoke: shrinking with NCCL_SHRINK_ABORT alone\n", lib.Version())
			o.how = "abort"
		}
	}
	o.mode = mode
	desc := mode
	if mode == "shrink" {
		desc += " (" + o.how + ", then ncclCommGrow)"
	}
	return desc
}

// runCycles runs the cycles until they are done, the budget (from start)
// is spent or one fails: the failure.
func (b *bench) runCycles(start time.Time) error {
	o := b.o
	for b.cycle = 0; b.cycle < o.cycles; b.cycle++ {
		if o.budget > 0 && time.Since(start) > o.budget {
			fmt.Printf("# budget %v spent after %d cycles\n", o.budget, b.cycle)
			break
		}
		t0 := time.Now()
		var err error
		if o.mode == "shrink" {
			err = b.shrinkCycle()
		} else {
			err = b.reinitCycle()
		}
		b.stats.add(b.cycle, "cycle", time.Since(t0))
		if err == nil {
			err = b.bg.check(b.cycle)
		}
		if err != nil {
			return fmt.Errorf("cycle %d: %w", b.cycle, err)
		}
	}
	return nil
}

// report prints the statistics and the result line and returns the exit
// code: 0 passed, 1 failed, 3 hung.
func (b *bench) report(failed error, done int, start time.Time, desc string) int {
	o := b.o
	var hang *hangError
	if errors.As(failed, &hang) {
		b.stats.print(os.Stdout)
		fmt.Printf("RESULT HANG: %v\n", failed)
		return 3
	}
	b.stats.print(os.Stdout)
	if o.csv != "" {
		if err := b.stats.writeCSV(o.csv); err != nil {
			fmt.Fprintln(os.Stderr, "shrinkgrow:", err)
		}
	}
	fmt.Printf("# %d cycles in %v\n", done, time.Since(start).Round(time.Millisecond))
	if failed != nil {
		fmt.Printf("RESULT FAIL: %v\n", failed)
		return 1
	}
	if done < o.cycles {
		fmt.Printf("RESULT FAIL: %d of %d cycles (the budget ran out)\n", done, o.cycles)
		return 1
	}
	fmt.Printf("RESULT PASS: %d cycles of %s, none hung, every all-reduce exact\n", done, desc)
	return 0
}

// setDefaultEnv sets what several ranks on one GPU need, unless set.
func setDefaultEnv(ranks int) {
	set := func(k, v string) {
		if _, ok := os.LookupEnv(k); !ok {
			os.Setenv(k, v)
		}
	}
	set("NCCL_MULTI_RANK_GPU_ENABLE", "1")
	set("NCCL_MAX_CTAS", strconv.Itoa(max(1, 16/ranks)))
	set("NCCL_NVLS_ENABLE", "0")
	// Connections made at init, not by the first collective, so that no
	// connection setup overlaps running kernels. It did not cure the one
	// hang seen before any cycle (the first all-reduce of the first
	// communicator: 2 of 5 runs with lazy connection, 1 of 6 without).
	set("NCCL_RUNTIME_CONNECT", "0")
}

func startWorker(dev cudadrv.Device, id, count int) (*worker, error) {
	w := &worker{id: id, work: make(chan func()), host: make([]float32, count)}
	ready := make(chan error)
	go func() {
		runtime.LockOSThread()
		ready <- func() error {
			ctx, err := dev.RetainPrimaryContext()
			if err != nil {
				return err
			}
			if err := ctx.SetCurrent(); err != nil {
				return err
			}
			if w.stream, err = cudadrv.NewStream(cudadrv.StreamNonBlocking); err != nil {
				return err
			}
			for _, p := range []*cudadrv.DevicePtr{&w.send, &w.recv, &w.hang} {
				if *p, err = cudadrv.MemAlloc(4 * count); err != nil {
					return err
				}
			}
			return nil
		}()
		for f := range w.work {
			f()
		}
	}()
	return w, <-ready
}

// phase runs f on every worker of ws (rank i is ws[i]) at once and returns
// its wall time; a worker that is not done within the cycle timeout is a
// hang, which ends the program.
func (b *bench) phase(name string, ws []*worker, f func(rank int, w *worker) error) error {
	return b.phaseAt(name, time.Now(), ws, f)
}

// phaseAt is phase timed from start.
func (b *bench) phaseAt(name string, start time.Time, ws []*worker, f func(rank int, w *worker) error) error {
	chans := make([]<-chan error, len(ws))
	for i, w := range ws {
		chans[i] = w.do(func() error { return f(i, w) })
	}
	timer := time.NewTimer(b.o.cycleTimeout)
	defer timer.Stop()
	var errs []error
	for i, ch := range chans {
		select {
		case err := <-ch:
			if err != nil {
				errs = append(errs, fmt.Errorf("rank %d: %w", i, err))
			}
		case <-timer.C:
			var stuck []string
			for j := i; j < len(chans); j++ {
				select {
				case <-chans[j]:
				default:
					stuck = append(stuck, strconv.Itoa(j))
				}
			}
			b.stats.print(os.Stdout)
			fmt.Printf("RESULT HANG: cycle %d, phase %s: ranks %s not done after %v\n", b.cycle, name, strings.Join(stuck, ","), b.o.cycleTimeout)
			os.Exit(3)
		}
	}
	b.last = time.Since(start)
	b.stats.add(b.cycle, name, b.last)
	return errors.Join(errs...)
}

func (b *bench) initWorld() error {
	id, err := b.lib.GetUniqueID()
	if err != nil {
		return err
	}
	n := len(b.workers)
	if err := b.phase("first-init", b.workers, func(r int, w *worker) (err error) {
		w.comm, err = b.lib.InitRank(n, id, r)
		return err
	}); err != nil {
		return err
	}
	return b.checkedAllReduce("first-allreduce", b.workers)
}

// checkedAllReduce is the checked all-reduce of the world ws, named name.
// Each is the first collective of a new communicator, whose enqueue may
// still set up connections and buffers. With -launch group (the default)
// one thread launches every rank's part in one NCCL group, as NCCL asks of
// a thread that drives several ranks: the group's end sets up every
// rank's connections before it launches any rank's kernel. With -launch
// threads each rank's thread launches its own; then a rank's kernel can
// spin, waiting for its peers, while a peer's enqueue is still in a CUDA
// call that waits for the device, in the same context: the hang in the
// first all-reduce of 4 ranks seen in 3 of 11 and 1 of 10 runs on the H200
// (bench/results/shrink-grow-2026-12-02-s2.md).
func (b *bench) checkedAllReduce(name string, ws []*worker) error {
	if b.o.launch == "threads" {
		return b.phase(name, ws, func(r int, w *worker) error {
			if err := b.launchCheck(r, w); err != nil {
				return err
			}
			return b.finishCheck(w)
		})
	}
	launched := make(chan struct{})
	var launchErr error
	return b.phase(name, ws, func(r int, w *worker) error {
		if r == 0 {
			launchErr = b.lib.Group(func() error {
				for i, x := range ws {
					if err := b.launchCheck(i, x); err != nil {
						return fmt.Errorf("rank %d: %w", i, err)
					}
				}
				return nil
			})
			close(launched)
		} else {
			<-launched // the phase's timeout names the ranks if this never comes
		}
		if launchErr != nil {
			if r == 0 {
				return fmt.Errorf("grouped launch: %w", launchErr)
			}
			return nil // rank 0 reports it
		}
		return b.finishCheck(w)
	})
}

// launchCheck enqueues rank r's part of the checked all-reduce on its
// stream: rank r gives r+1+cycle everywhere, so the sum is exact and
// differs per cycle.
func (b *bench) launchCheck(r int, w *worker) error {
	if me, err := w.comm.UserRank(); err != nil || me != r {
		return fmt.Errorf("the communicator says rank %d (%v), the benchmark expects %d", me, err, r)
	}
	v := float32(r + 1 + b.cycle)
	if err := cudadrv.MemsetD32Async(w.send, math.Float32bits(v), b.o.count, w.stream); err != nil {
		return err
	}
	return w.comm.AllReduce(uintptr(w.send), uintptr(w.recv), b.o.count, nccl.Float32, nccl.Sum, uintptr(w.stream))
}

// finishCheck waits for the rank's all-reduce and checks every element.
func (b *bench) finishCheck(w *worker) error {
	n, err := w.comm.Count()
	if err != nil {
		return err
	}
	if err := cudadrv.CopyFromDeviceAsync(w.host, w.recv, w.stream); err != nil {
		return err
	}
	if err := w.stream.Synchronize(); err != nil {
		return err
	}
	want := float32(n*(n+1)/2 + n*b.cycle)
	for i, x := range w.host {
		if x != want {
			return fmt.Errorf("all-reduce of %d ranks: element %d is %v, want %v (wrong result)", n, i, x, want)
		}
	}
	return nil
}

// fail makes rank v of the current world dead: the survivors (in their
// order) are returned, with an all-reduce in flight that v never joins.
func (b *bench) fail(v int) (survivors []*worker, dead *worker, err error) {
	dead = b.workers[v]
	for i, w := range b.workers {
		if i != v {
			survivors = append(survivors, w)
		}
	}
	if b.o.inflight {
		err = b.phase("inflight-launch", survivors, func(_ int, w *worker) error {
			return w.comm.AllReduce(uintptr(w.hang), uintptr(w.hang), b.o.count, nccl.Float32, nccl.Sum, uintptr(w.stream))
		})
	}
	return survivors, dead, err
}

func (b *bench) shrinkCycle() error {
	n := len(b.workers)
	v := b.cycle % n
	survivors, dead, err := b.fail(v)
	if err != nil {
		return err
	}
	mode := nccl.ShrinkDefault
	if strings.Contains(b.o.how, "abort") {
		mode = nccl.ShrinkAbort
	}
	revoke := strings.Contains(b.o.how, "revoke")
	ctx, cancel := context.WithTimeout(context.Background(), b.o.cycleTimeout)
	defer cancel()
	revokeTimes := make([]time.Duration, len(survivors))
	parents := make([]*nccl.Comm, len(survivors))
	err = b.phase("shrink", survivors, func(r int, w *worker) error {
		if revoke {
			t := time.Now()
			if err := w.comm.Revoke(ctx); err != nil {
				return err
			}
			revokeTimes[r] = time.Since(t)
		}
		child, err := w.comm.Shrink(ctx, []int{v}, nil, mode)
		if err != nil {
			return err
		}
		parents[r], w.comm = w.comm, child
		return nil
	})
	shrinkTime := b.last
	if revoke {
		b.stats.add(b.cycle, "shrink:revoke-part", slices.Max(revokeTimes))
	}
	if err != nil {
		return err
	}
	// The shrunk world works: its first all-reduce also waits for the
	// in-flight one, which the revoke or the abortive shrink ended.
	if err := b.checkedAllReduce("allreduce-shrunk", survivors); err != nil {
		return err
	}
	// The parents are aborted, never destroyed (ncclCommDestroy after an
	// abortive shrink hangs in NCCL 2.31.2); the dead rank's communicator
	// is freed now that no kernel points at its buffers.
	for _, p := range parents {
		b.bg.start("parent-abort", b.cycle, p.Abort)
	}
	b.bg.start("dead-abort", b.cycle, dead.comm.Abort)
	dead.comm = nil

	// Grow back onto a replacement (the dead rank's thread, fresh).
	ids := make(chan nccl.UniqueID, 1)
	grown := append(slices.Clone(survivors), dead)
	shrunk := make([]*nccl.Comm, len(survivors))
	err = b.phase("grow", grown, func(r int, w *worker) error {
		if w == dead {
			var id nccl.UniqueID
			select {
			case id = <-ids:
			case <-ctx.Done():
				return fmt.Errorf("no grow id from the root: %w", ctx.Err())
			}
			c, err := b.lib.JoinGrow(ctx, n, id, n-1, nil)
			w.comm = c
			return err
		}
		var rootID *nccl.UniqueID
		if r == b.o.growRoot {
			id, err := w.comm.GrowID()
			if err != nil {
				return err
			}
			ids <- id
			rootID = &id
		}
		c, err := w.comm.Grow(ctx, n, rootID, nil)
		if err != nil {
			return err
		}
		shrunk[r], w.comm = w.comm, c
		return nil
	})
	if err != nil {
		return err
	}
	b.stats.add(b.cycle, "recovery=shrink+grow", shrinkTime+b.last)
	b.workers = grown
	// The shrunk communicators are healthy: destroyed the ordinary way.
	for _, c := range shrunk {
		b.bg.start("shrunk-destroy", b.cycle, c.Destroy)
	}
	if err := b.bg.barrier(b.cycle, "bg-wait"); err != nil {
		return err
	}
	return b.checkedAllReduce("allreduce-grown", grown)
}

func (b *bench) reinitCycle() error {
	n := len(b.workers)
	v := b.cycle % n
	survivors, dead, err := b.fail(v)
	if err != nil {
		return err
	}
	// Today's recovery: abort in the background (the abort flag ends the
	// in-flight kernel), then a new world from a new unique id.
	for _, w := range survivors {
		b.bg.start("old-abort", b.cycle, w.comm.Abort)
		w.comm = nil
	}
	deadComm := dead.comm
	dead.comm = nil
	world := append(slices.Clone(survivors), dead)
	ctx, cancel := context.WithTimeout(context.Background(), b.o.cycleTimeout)
	defer cancel()
	start := time.Now()
	id, err := b.lib.GetUniqueID() // the coordinator's part: a new id for every rank
	if err != nil {
		return err
	}
	err = b.phaseAt("reinit", start, world, func(r int, w *worker) error {
		var err error
		if b.o.mode == "reinit" {
			w.comm, err = b.lib.InitRank(n, id, r)
			return err
		}
		boot, err := b.lib.InitRankConfig(ctx, n, id, r, &nccl.Config{NonBlocking: true, SplitShare: nccl.Set(1)})
		if err != nil {
			return err
		}
		w.comm, err = boot.Split(ctx, 0, r, &nccl.Config{})
		if err != nil {
			boot.Abort()
			return err
		}
		if err := boot.Finalize(ctx); err != nil {
			boot.Abort()
			return nil
		}
		return boot.Destroy()
	})
	if err != nil {
		return err
	}
	b.stats.add(b.cycle, "recovery=reinit", b.last)
	b.workers = world
	// The dead rank's communicator goes after the re-init: the survivors'
	// aborts raised their abort flags, which end the in-flight kernels that
	// point at its buffers, as their first step, long before.
	b.bg.start("dead-abort", b.cycle, deadComm.Abort)
	if err := b.bg.barrier(b.cycle, "bg-wait"); err != nil {
		return err
	}
	return b.checkedAllReduce("allreduce-reinit", world)
}
