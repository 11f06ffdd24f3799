package ncclcomm

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gotrain/gotrain/gpu/cudadrv"
	"github.com/gotrain/gotrain/internal/osthread"
	"github.com/gotrain/gotrain/nccl"
	"github.com/gotrain/gotrain/worker/comm"
)

// Config configures a communicator.
type Config struct {
	Name       string       // communicator name; part of the rendezvous key
	Generation int64        // job generation; part of the rendezvous key
	Rank, Size int          // this rank and the number of ranks
	Device     int          // CUDA device ordinal as this process sees it (see DeviceFor)
	Store      comm.Store   // rendezvous: rank 0 Puts the NCCL unique id, the others Get it
	Tuning     Tuning       // stream priority and NCCL CTA limits (options.go); zero: defaults
	Logger     *slog.Logger // may be nil (then discard)

	// NoSplitShare gives the communicator of the collectives resources of
	// its own instead of sharing the init communicator's (ncclConfig_t
	// splitShare; see initNCCL). NCCL_COMM_SPLIT_SHARE_RESOURCES, when
	// set, overrides both.
	NoSplitShare bool
}

func (cfg *Config) validate() error {
	switch {
	case cfg.Size < 1:
		return fmt.Errorf("ncclcomm: size is %d, want at least 1", cfg.Size)
	case cfg.Rank < 0 || cfg.Rank >= cfg.Size:
		return fmt.Errorf("ncclcomm: rank %d is out of range for %d ranks (want 0..%d)", cfg.Rank, cfg.Size, cfg.Size-1)
	case cfg.Name == "":
		return errors.New("ncclcomm: the communicator needs a Name (it scopes the rendezvous key)")
	case cfg.Generation < 0:
		return fmt.Errorf("ncclcomm: generation is %d, want at least 0", cfg.Generation)
	case cfg.Device < 0:
		return fmt.Errorf("ncclcomm: device is %d, want a CUDA device ordinal (0 or more)", cfg.Device)
	case cfg.Size > 1 && cfg.Store == nil:
		return errors.New("ncclcomm: Store is nil; the ranks need a rendezvous store to share NCCL's unique id")
	}
	return cfg.Tuning.validate()
}

// IDKey returns the Store key under which rank 0 publishes the NCCL unique id.
func IDKey(name string, generation int64) string {
	return fmt.Sprintf("ncclcomm/%s/%d/id", name, generation)
}

// DeviceFor returns the CUDA device ordinal a worker uses for the node's GPU
// index gpu. `gotrain launch` lists the job's GPUs of the node in
// CUDA_VISIBLE_DEVICES (as getenv reads it) in local-rank order, so the
// device is gpu's position in that list; a list of one (a standby's) makes
// it 0. Without the variable, or without gpu in it, it is gpu itself (0
// when negative).
func DeviceFor(gpu int, getenv func(string) string) int {
	v := getenv("CUDA_VISIBLE_DEVICES")
	if v == "" {
		return max(gpu, 0)
	}
	ids := strings.Split(v, ",")
	if len(ids) == 1 {
		return 0
	}
	for i, id := range ids {
		if n, err := strconv.Atoi(strings.TrimSpace(id)); err == nil && n == gpu {
			return i
		}
	}
	return max(gpu, 0)
}

// Comm is a communicator of the NCCL backend. It owns an OS thread with its
// device's primary context current, a CUDA stream and an NCCL communicator;
// every CUDA and NCCL call it makes runs on that thread. Like every comm.Comm
// it runs one collective at a time.
type Comm struct {
	name       string
	rank, size int
	device     int
	tuning     Tuning
	splitShare bool
	times      Timings
	log        *slog.Logger

	lib    *nccl.Library
	exec   *osthread.Executor
	dev    cudadrv.Device
	ctx    cudadrv.Context
	stream cudadrv.Stream
	nc     *nccl.Comm

	// Owned by the executor's thread.
	scratch      cudadrv.DevicePtr // staging for host buffers
	scratchBytes int
	barrier      cudadrv.DevicePtr // one int32 for Barrier

	seq     atomic.Uint64
	abortMu sync.Mutex // held while ncclCommAbort runs
	onAbort abortHooks
	closeMu sync.Mutex
	closed  atomic.Bool
}

var _ comm.Comm = (*Comm)(nil)

// New validates cfg, loads the CUDA driver and NCCL, starts the
// communicator's thread on cfg.Device, shares NCCL's unique id through
// cfg.Store (rank 0 creates and Puts it under IDKey, the others Get it) and
// creates the NCCL communicator. The init is non-blocking where NCCL allows
// it (2.14 and newer): when ctx ends first (a rank never came), New aborts it
// and returns. Errors name the rank and carry NCCL's message.
func New(ctx context.Context, cfg Config) (*Comm, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	c := &Comm{
		name: cfg.Name, rank: cfg.Rank, size: cfg.Size, device: cfg.Device, tuning: cfg.Tuning,
		splitShare: !cfg.NoSplitShare, times: Timings{Start: time.Now()},
		log: log.With("comm", cfg.Name, "generation", cfg.Generation, "rank", cfg.Rank, "device", cfg.Device),
	}
	fail := func(format string, args ...any) (*Comm, error) {
		return nil, fmt.Errorf("ncclcomm: rank %d: "+format, append([]any{c.rank}, args...)...)
	}
	applyNCCLDefaults()
	// After Prewarm (worker.Init) the driver, NCCL and the primary context
	// are loaded or being loaded: these calls then wait for it.
	drv, err := cudadrv.Load()
	if err != nil {
		return fail("%w", err)
	}
	c.times.Driver = time.Now()
	if c.lib, err = nccl.Load(); err != nil {
		return fail("%w", err)
	}
	c.times.NCCL = time.Now()
	if n, err := drv.DeviceCount(); err != nil {
		return fail("count CUDA devices: %w", err)
	} else if cfg.Device >= n {
		return fail("CUDA device %d does not exist: this process sees %d device(s) (CUDA_VISIBLE_DEVICES limits them)", cfg.Device, n)
	}

	// The thread's setup (primary context, stream, memory) runs while the
	// unique id is exchanged: neither needs the other.
	type started struct {
		e   *osthread.Executor
		err error
		at  time.Time
	}
	setup := make(chan started, 1)
	go func() {
		e, err := osthread.Start(func() error { return c.setupThread(drv) }, c.teardownThread)
		setup <- started{e, err, time.Now()}
	}()
	id, idErr := c.uniqueID(ctx, cfg)
	idAt := time.Now()
	s := <-setup
	c.exec, c.times.Context = s.e, s.at
	switch {
	case s.err != nil:
		return fail("%w", s.err)
	case idErr != nil:
		c.exec.Stop()
		return fail("%w", idErr)
	}
	c.times.ID = idAt
	commName := cfg.Name + "/" + strconv.FormatInt(cfg.Generation, 10)
	awaitWarmup(ctx, cfg.Device)
	err = c.exec.Do(func() error { return c.initNCCL(ctx, id, commName) })
	if err != nil {
		c.exec.Stop()
		return fail("init NCCL communicator %q of %d ranks on device %d: %w", cfg.Name, c.size, c.device, err)
	}
	c.times.Ready = time.Now()
	c.times.WarmStart, c.times.WarmDriver, c.times.WarmContext, c.times.WarmComm = warmTimes(cfg.Device)
	c.log.Debug("NCCL communicator ready", "nccl", c.lib.Version(), "took", c.times.Ready.Sub(c.times.Start))
	return c, nil
}

// uniqueID returns NCCL's unique id of the communicator: rank 0 creates it
// and Puts it under IDKey, the others Get it.
func (c *Comm) uniqueID(ctx context.Context, cfg Config) (nccl.UniqueID, error) {
	var id nccl.UniqueID
	key := IDKey(cfg.Name, cfg.Generation)
	if c.rank == 0 {
		id, err := c.lib.GetUniqueID()
		if err != nil {
			return id, err
		}
		if c.size > 1 {
			if err := cfg.Store.Put(ctx, key, id[:]); err != nil {
				return id, fmt.Errorf("publish the NCCL unique id: %w", err)
			}
		}
		return id, nil
	}
	b, err := cfg.Store.Get(ctx, key)
	if err != nil {
		return id, fmt.Errorf("get the NCCL unique id from rank 0: %w", err)
	}
	if id, err = nccl.UniqueIDFromBytes(b); err != nil {
		return id, fmt.Errorf("the unique id under %q: %w", key, err)
	}
	return id, nil
}

// initNCCL creates the NCCL communicator on the executor's thread.
//
// A non-blocking init can be abandoned when ctx ends, but a non-blocking
// communicator is slow for collectives: NCCL 2.2x runs the launch of every
// non-blocking group on a new thread and answers InProgress. So the
// communicator is made in two steps: a non-blocking ncclCommInitRankConfig,
// which waits for every rank and can be aborted, then a blocking
// ncclCommSplit of all ranks into the communicator the collectives use, and
// the first one is destroyed. NCCL older than 2.18 (no Split) gets one
// blocking init, which ctx cannot interrupt.
//
// The split costs a second communicator setup. Unless Config.NoSplitShare,
// the init communicator is created with splitShare=1, which is what lets a
// split share its parent's resources (NCCL decides by the parent's config):
// the proxy thread and its sockets, the streams and the peers' connection
// buffers are made once instead of twice. NCCL counts the references to
// shared resources, so destroying the init communicator leaves them to the
// split one, which frees them when it is destroyed or aborted. The split
// communicator gets at most as many channels as its parent, so the parent
// gets the same CTA limits. The guarantee does not change: both steps are
// polled against ctx, and the init communicator is aborted when the split
// fails.
func (c *Comm) initNCCL(ctx context.Context, id nccl.UniqueID, commName string) error {
	if !c.lib.Has("ncclCommInitRankConfig") || !c.lib.Has("ncclCommSplit") {
		c.log.Warn("NCCL predates ncclCommSplit (2.18): blocking init, which the context cannot interrupt", "nccl", c.lib.Version())
		nc, err := c.lib.InitRank(c.size, id, c.rank)
		c.nc = nc
		return err
	}
	boot, err := c.lib.InitRankConfig(ctx, c.size, id, c.rank, c.initConfig(commName))
	if err != nil {
		return err
	}
	c.times.Init = time.Now()
	c.nc, err = boot.Split(ctx, 0, c.rank, c.tuning.ncclConfig(commName))
	c.times.Split = time.Now()
	if err != nil {
		boot.Abort()
		return fmt.Errorf("split the blocking communicator off: %w", err)
	}
	if c.nc == nil {
		boot.Abort()
		return errors.New("ncclCommSplit gave this rank no communicator")
	}
	fctx, cancel := context.WithTimeout(ctx, closeTimeout)
	defer cancel()
	if err := boot.Finalize(fctx); err != nil {
		c.log.Debug("finalize the init communicator", "err", err)
		boot.Abort()
		return nil
	}
	if err := boot.Destroy(); err != nil {
		c.log.Debug("destroy the init communicator", "err", err)
	}
	return nil
}

// initConfig returns the configuration of the non-blocking communicator
// that initNCCL creates first, named after commName.
func (c *Comm) initConfig(commName string) *nccl.Config {
	cfg := c.tuning.ncclConfig(commName + "/init")
	cfg.NonBlocking = true
	if c.splitShare {
		cfg.SplitShare = nccl.Set(1)
	}
	return cfg
}

// setupThread runs first on the executor's thread: the device's primary
// context becomes current and the communicator's stream is created.
func (c *Comm) setupThread(drv *cudadrv.Driver) (err error) {
	if c.dev, err = drv.Device(c.device); err != nil {
		return err
	}
	if c.ctx, err = c.dev.RetainPrimaryContext(); err != nil {
		return err
	}
	if err = c.ctx.SetCurrent(); err == nil {
		c.stream, err = c.tuning.newStream()
	}
	if err == nil {
		c.barrier, err = cudadrv.MemAlloc(4)
	}
	if err != nil {
		if c.stream != 0 {
			c.stream.Destroy()
		}
		c.dev.ReleasePrimaryContext()
	}
	return err
}

// teardownThread runs last on the executor's thread.
func (c *Comm) teardownThread() {
	if c.scratch != 0 {
		c.scratch.Free()
		c.scratch, c.scratchBytes = 0, 0
	}
	if c.barrier != 0 {
		c.barrier.Free()
	}
	c.stream.Destroy()
	c.dev.ReleasePrimaryContext()
}

func (c *Comm) Rank() int { return c.rank }
func (c *Comm) Size() int { return c.size }

// Device returns the CUDA device ordinal of the communicator.
func (c *Comm) Device() int { return c.device }

// Stream returns the communicator's CUDA stream (a CUstream): its
// collectives run there, in order. Work on other streams orders against it
// with events.
func (c *Comm) Stream() uintptr { return uintptr(c.stream) }

// NCCL returns the NCCL communicator, for calls this package does not wrap.
// Call it only inside Do.
func (c *Comm) NCCL() *nccl.Comm { return c.nc }

// Library returns the loaded NCCL.
func (c *Comm) Library() *nccl.Library { return c.lib }

// Seq returns the number of collectives issued so far.
func (c *Comm) Seq() uint64 { return c.seq.Load() }

// Do runs fn on the communicator's thread, where the device's primary context
// is current: the place for CUDA and NCCL calls on Stream and NCCL (events,
// copies, several collectives back to back). fn must not call c's other
// methods (they would wait for fn).
func (c *Comm) Do(fn func() error) error {
	if c.closed.Load() {
		return comm.ErrClosed
	}
	return c.exec.Do(fn)
}

// errorf names the rank, the collective and the communicator.
func (c *Comm) errorf(op string, seq uint64, err error) error {
	return fmt.Errorf("ncclcomm: rank %d: %s (collective #%d of comm %q): %w", c.rank, op, seq, c.name, err)
}
