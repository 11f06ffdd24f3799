package ncclcomm

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"time"

	"github.com/gotrain/gotrain/gpu/cudadrv"
	"github.com/gotrain/gotrain/nccl"
)

// Prewarm starts, in the background, the slowest part of a new process's
// first communicator: loading the CUDA driver (cuInit), creating device's
// primary context (cuDevicePrimaryCtxRetain) and loading NCCL. worker.Init
// calls it for the NCCL backend, so that this work overlaps the program's own
// start-up and the rendezvous; New then finds the driver loaded and the
// context made (cudadrv.Load, nccl.Load and the driver serialize concurrent
// callers, so New waits for a prewarm still in progress instead of doing
// the work twice).
//
// Prewarm keeps its reference to the primary context for the life of the
// process: the context outlives the communicators, so a process that
// recovers in place (worker.Run) does not destroy and create it again
// between generations. Without a driver, or with no such device, it does
// nothing: New reports the error as it always did. Calling it again for the
// same device does nothing.
func Prewarm(device int) { prewarm(device, nil) }

// PrewarmComm does what Prewarm does and then creates and destroys a
// one-rank NCCL communicator on the device. Most of a process's first
// ncclCommInitRank is work NCCL does once per process and device whatever
// the communicator: loading its kernels (it asks CUDA for every kernel's
// attributes, which loads the modules), NVML and the topology probes. A
// hot standby (gotrain launch --standby) has time to spare before it is
// handed a rank, and its first real communicator is on the critical path of
// a restart, so it does that work here. New waits for a PrewarmComm still in
// progress on its device instead of initialising beside it. A process that
// is about to make its first communicator anyway gains nothing from it:
// worker.Init uses Prewarm.
func PrewarmComm(device int) { prewarm(device, warmComm) }

func prewarm(device int, comm func(cudadrv.Context, *nccl.Library) error) {
	if device < 0 {
		return
	}
	applyNCCLDefaults()
	warmMu.Lock()
	defer warmMu.Unlock()
	if warms[device] != nil {
		return
	}
	w := &warmup{start: time.Now(), done: make(chan struct{}), comm: comm}
	warms[device] = w
	go w.run(device, cudadrv.Load, nccl.Load)
}

// warmComm creates a one-rank communicator on ctx's device and destroys it.
// It runs on the warm-up's goroutine, which it locks to its thread (the
// thread ends with the goroutine, taking the current context with it).
func warmComm(ctx cudadrv.Context, lib *nccl.Library) error {
	runtime.LockOSThread()
	if err := ctx.SetCurrent(); err != nil {
		return err
	}
	id, err := lib.GetUniqueID()
	if err != nil {
		return err
	}
	c, err := lib.InitRank(1, id, 0)
	if err != nil {
		return fmt.Errorf("one-rank warm-up communicator: %w", err)
	}
	return c.Destroy()
}

// awaitWarmup waits until the device's warm-up, if any, has ended, or ctx
// has: a communicator initialised while PrewarmComm's own is being made
// would compete with it for the same once-per-process work.
func awaitWarmup(ctx context.Context, device int) {
	w := warmupOf(device)
	if w == nil {
		return
	}
	select {
	case <-w.done:
	case <-ctx.Done():
	}
}

// warmupOf returns the device's warm-up, nil when none was started.
func warmupOf(device int) *warmup {
	warmMu.Lock()
	defer warmMu.Unlock()
	return warms[device]
}

var (
	warmMu sync.Mutex
	warms  = map[int]*warmup{}
)

// warmup is one device's Prewarm.
type warmup struct {
	start           time.Time
	done            chan struct{} // closed when both loads have ended
	driver, context time.Time     // cuInit done, primary context retained; zero on failure
	nccl            time.Time     // NCCL loaded; zero on failure
	commDone        time.Time     // PrewarmComm's communicator made and destroyed; zero otherwise
	err             error         // the first failure, for the log

	comm func(cudadrv.Context, *nccl.Library) error // PrewarmComm's extra step; nil for Prewarm
}

// run does the work; the loaders are parameters so that a test can run it
// without a driver.
func (w *warmup) run(device int, loadDriver func() (*cudadrv.Driver, error), loadNCCL func() (*nccl.Library, error)) {
	defer close(w.done)
	// dlopen of NCCL (a large library) overlaps cuInit.
	ncclDone := make(chan struct{})
	var lib *nccl.Library
	go func() {
		defer close(ncclDone)
		l, err := loadNCCL()
		if err == nil {
			lib, w.nccl = l, time.Now()
		}
	}()
	defer func() { <-ncclDone }()
	drv, err := loadDriver()
	if err != nil {
		w.err = err
		return
	}
	w.driver = time.Now()
	if n, err := drv.DeviceCount(); err != nil || device >= n {
		w.err = err
		return
	}
	dev, err := drv.Device(device)
	if err != nil {
		w.err = err
		return
	}
	// Never released: see Prewarm.
	ctx, err := dev.RetainPrimaryContext()
	if err != nil {
		w.err = err
		return
	}
	w.context = time.Now()
	if w.comm == nil {
		return
	}
	if <-ncclDone; lib == nil {
		return // New reports why NCCL does not load
	}
	if err := w.comm(ctx, lib); err != nil {
		w.err = err
		return
	}
	w.commDone = time.Now()
}

// warmTimes returns what Prewarm did for device so far, without waiting.
func warmTimes(device int) (start, driver, context, comm time.Time) {
	w := warmupOf(device)
	if w == nil {
		return
	}
	select {
	case <-w.done:
		return w.start, w.driver, w.context, w.commDone
	default:
		return w.start, time.Time{}, time.Time{}, time.Time{}
	}
}

// Timings says when New reached each of its steps (wall clock), for
// start-up breakdowns such as bench/restart_quick.sh's. A zero time is a
// step that did not happen.
type Timings struct {
	// Prewarm (started, driver loaded, primary context retained, and for
	// PrewarmComm the one-rank communicator done), when it ran for the
	// device and had finished by the time New returned.
	WarmStart, WarmDriver, WarmContext, WarmComm time.Time
	Start                                        time.Time // New was called
	Driver                                       time.Time // the CUDA driver is loaded (cuInit)
	NCCL                                         time.Time // NCCL is loaded
	ID                                           time.Time // NCCL's unique id is in hand (rank 0: made and published; others: received)
	Context                                      time.Time // the communicator's thread has the primary context current, its stream and memory
	Init                                         time.Time // the non-blocking communicator is ready (ncclCommInitRankConfig)
	Split                                        time.Time // the blocking communicator is split off it (ncclCommSplit)
	Ready                                        time.Time // New returns: the init communicator is destroyed
}

// Timings returns when New reached each of its steps.
func (c *Comm) Timings() Timings { return c.times }
