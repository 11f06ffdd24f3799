package ncclcomm

import (
	"sync"
	"time"

	"github.com/gotrain/gotrain/internal/cudadrv"
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
func Prewarm(device int) {
	if device < 0 {
		return
	}
	warmMu.Lock()
	defer warmMu.Unlock()
	if warms[device] != nil {
		return
	}
	w := &warmup{start: time.Now(), done: make(chan struct{})}
	warms[device] = w
	go w.run(device, cudadrv.Load, nccl.Load)
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
	err             error         // the first failure, for the log
}

// run does the work; the loaders are parameters so that a test can run it
// without a driver.
func (w *warmup) run(device int, loadDriver func() (*cudadrv.Driver, error), loadNCCL func() (*nccl.Library, error)) {
	defer close(w.done)
	// dlopen of NCCL (a large library) overlaps cuInit.
	ncclDone := make(chan struct{})
	go func() {
		defer close(ncclDone)
		if _, err := loadNCCL(); err == nil {
			w.nccl = time.Now()
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
	if _, err := dev.RetainPrimaryContext(); err != nil {
		w.err = err
		return
	}
	w.context = time.Now()
}

// warmTimes returns what Prewarm did for device so far, without waiting.
func warmTimes(device int) (start, driver, context time.Time) {
	warmMu.Lock()
	w := warms[device]
	warmMu.Unlock()
	if w == nil {
		return
	}
	select {
	case <-w.done:
		return w.start, w.driver, w.context
	default:
		return w.start, time.Time{}, time.Time{}
	}
}

// Timings says when New reached each of its steps (wall clock), for
// start-up breakdowns such as bench/restart_quick.sh's. A zero time is a
// step that did not happen.
type Timings struct {
	// Prewarm (started, driver loaded, primary context retained), when
	// Prewarm ran for the device and had finished by the time New returned.
	WarmStart, WarmDriver, WarmContext time.Time
	Start                              time.Time // New was called
	Driver                             time.Time // the CUDA driver is loaded (cuInit)
	NCCL                               time.Time // NCCL is loaded
	ID                                 time.Time // NCCL's unique id is in hand (rank 0: made and published; others: received)
	Context                            time.Time // the communicator's thread has the primary context current, its stream and memory
	Init                               time.Time // the non-blocking communicator is ready (ncclCommInitRankConfig)
	Split                              time.Time // the blocking communicator is split off it (ncclCommSplit)
	Ready                              time.Time // New returns: the init communicator is destroyed
}

// Timings returns when New reached each of its steps.
func (c *Comm) Timings() Timings { return c.times }
