package nccl

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync/atomic"
	"time"
)

// SplitNoColor is the color of a rank that Split leaves out (NCCL_SPLIT_NOCOLOR).
const SplitNoColor = -1

// Comm is an NCCL communicator (ncclComm_t). Its collectives enqueue work on
// a CUDA stream of the device it was created on and return without waiting
// for it. A Comm is not safe for concurrent collectives; Abort may be called
// from another goroutine to break a hung one.
type Comm struct {
	h           atomic.Uintptr // ncclComm_t; 0 once destroyed or aborted
	lib         *Library
	cfg         *cConfig // C strings NCCL may point at until the comm dies
	slot        slot     // where NCCL stored the handle; NCCL may write it late
	nonBlocking bool
	revoked     atomic.Bool // Revoke ran: Finalize is invalid
	abortOnly   atomic.Bool // an abortive Shrink came from c: never ncclCommDestroy
}

// GetUniqueID returns a new unique id: rank 0 calls it and hands the id to
// every other rank.
func (l *Library) GetUniqueID() (UniqueID, error) {
	var id UniqueID
	if r := cGetUniqueID(&id); r != Success {
		return id, newError("ncclGetUniqueId", r, 0)
	}
	return id, nil
}

// InitRank creates this rank's communicator of nranks ranks (ncclCommInitRank).
// The calling OS thread's current CUDA context (or cudaSetDevice's device)
// picks the GPU. It blocks until every rank has joined; to init several
// ranks from one thread, call it inside Group.
func (l *Library) InitRank(nranks int, id UniqueID, rank int) (*Comm, error) {
	if err := checkRank(nranks, rank); err != nil {
		return nil, err
	}
	sl := newSlot()
	r := cInitRank(sl, nranks, &id, rank)
	return l.finishInit(context.Background(), "ncclCommInitRank", sl, r, nil, false, nil)
}

// InitRankConfig is InitRank with a Config (ncclCommInitRankConfig, NCCL 2.14).
// With cfg.NonBlocking it polls until the communicator is ready, and aborts
// it when ctx ends first; a blocking init does not look at ctx.
func (l *Library) InitRankConfig(ctx context.Context, nranks int, id UniqueID, rank int, cfg *Config) (*Comm, error) {
	if err := l.need("ncclCommInitRankConfig"); err != nil {
		return nil, err
	}
	if err := checkRank(nranks, rank); err != nil {
		return nil, err
	}
	cc, err := cfg.toC()
	if err != nil {
		return nil, err
	}
	sl := newSlot()
	r := cInitRankConfig(sl, nranks, &id, rank, cc)
	return l.finishInit(ctx, "ncclCommInitRankConfig", sl, r, cc, cfg != nil && cfg.NonBlocking, nil)
}

// InitRankScalable creates the communicator from several unique ids, which
// spreads the bootstrap over several roots at scale
// (ncclCommInitRankScalable, NCCL 2.23). Every rank passes the same ids in
// the same order. ctx and cfg as for InitRankConfig; cfg may be nil.
func (l *Library) InitRankScalable(ctx context.Context, nranks, rank int, ids []UniqueID, cfg *Config) (*Comm, error) {
	if err := l.need("ncclCommInitRankScalable"); err != nil {
		return nil, err
	}
	if err := checkRank(nranks, rank); err != nil {
		return nil, err
	}
	if len(ids) == 0 || len(ids) > nranks {
		return nil, fmt.Errorf("nccl: InitRankScalable needs 1 to %d unique ids, got %d", nranks, len(ids))
	}
	cc, err := cfg.toC()
	if err != nil {
		return nil, err
	}
	sl := newSlot()
	r := cInitRankScalable(sl, nranks, rank, ids, cc)
	return l.finishInit(ctx, "ncclCommInitRankScalable", sl, r, cc, cfg != nil && cfg.NonBlocking, nil)
}

func checkRank(nranks, rank int) error {
	if nranks < 1 || rank < 0 || rank >= nranks {
		return fmt.Errorf("nccl: rank %d of %d ranks is out of range", rank, nranks)
	}
	return nil
}

// finishInit turns the result of an init or split into a Comm, waiting for a
// non-blocking one. parent is the communicator a split came from: when it is
// non-blocking, NCCL stores the new handle into the slot only once the split
// is done. A successful split with no communicator for this rank gives nil, nil.
func (l *Library) finishInit(ctx context.Context, op string, sl slot, r Result, cc *cConfig, nonBlocking bool, parent *Comm) (*Comm, error) {
	fail := func(err error) (*Comm, error) {
		if h := sl.load(); h != 0 {
			cAbort(h)
		}
		sl.free()
		cc.free()
		return nil, err
	}
	if r == missingSymbol {
		return fail(l.need(op))
	}
	if r != Success && r != InProgress {
		return fail(newError(op, r, sl.load()))
	}
	h := sl.load()
	if h == 0 && parent != nil && (parent.nonBlocking || r == InProgress) {
		var err error
		if h, err = parent.waitSlot(ctx, sl); err != nil {
			return fail(fmt.Errorf("%s: %w", op, err))
		}
	}
	if h == 0 {
		if parent == nil {
			return fail(fmt.Errorf("nccl: %s returned %s and no communicator", op, r.String()))
		}
		sl.free()
		cc.free()
		return nil, nil
	}
	c := &Comm{lib: l, cfg: cc, slot: sl, nonBlocking: nonBlocking}
	c.h.Store(h)
	if r == InProgress || nonBlocking {
		if err := c.Wait(ctx); err != nil {
			c.Abort()
			return nil, fmt.Errorf("%s: %w", op, err)
		}
	}
	return c, nil
}

// waitSlot polls until NCCL has stored a split's new handle into sl, or c
// reports an error, or ctx ends.
func (c *Comm) waitSlot(ctx context.Context, sl slot) (uintptr, error) {
	delay := 10 * time.Microsecond
	for {
		if h := sl.load(); h != 0 {
			return h, nil
		}
		if err := c.AsyncError(); err != nil && !errors.Is(err, InProgress) {
			return 0, err
		}
		select {
		case <-ctx.Done():
			return 0, fmt.Errorf("nccl: waiting for the new communicator: %w", ctx.Err())
		case <-time.After(delay):
		}
		delay = min(2*delay, 5*time.Millisecond)
	}
}

// Split creates communicators from c's ranks: the ranks that pass the same
// color form one, ordered by key (ncclCommSplit, NCCL 2.18). It is collective
// over c. A rank that passes SplitNoColor gets nil, nil. A nil cfg inherits
// c's configuration.
func (c *Comm) Split(ctx context.Context, color, key int, cfg *Config) (*Comm, error) {
	if err := c.lib.need("ncclCommSplit"); err != nil {
		return nil, err
	}
	h := c.h.Load()
	if h == 0 {
		return nil, ErrClosed
	}
	var cc *cConfig
	nonBlocking := c.nonBlocking
	if cfg != nil {
		var err error
		if cc, err = cfg.toC(); err != nil {
			return nil, err
		}
		nonBlocking = cfg.NonBlocking
	}
	sl := newSlot()
	r := cSplit(h, color, key, sl, cc)
	if color == SplitNoColor && (r == Success || r == InProgress) {
		// No communicator for this rank; a non-blocking parent tells when
		// its part of the split is done.
		var err error
		if r == InProgress || c.nonBlocking {
			err = c.Wait(ctx)
		}
		sl.free()
		cc.free()
		return nil, err
	}
	return c.lib.finishInit(ctx, "ncclCommSplit", sl, r, cc, nonBlocking, c)
}

// Handle returns the ncclComm_t, or 0 once the Comm is destroyed or aborted.
func (c *Comm) Handle() uintptr { return c.h.Load() }

// NonBlocking reports whether c was created with Config.NonBlocking.
func (c *Comm) NonBlocking() bool { return c.nonBlocking }

// Wait polls ncclCommGetAsyncError until c is no longer InProgress: after a
// non-blocking init, split, finalize, group or collective. It returns the
// communicator's error, if any, or ctx's.
func (c *Comm) Wait(ctx context.Context) error {
	h := c.h.Load()
	if h == 0 {
		return ErrClosed
	}
	delay := 10 * time.Microsecond
	var timer *time.Timer
	for {
		state, r := cAsyncError(h)
		if r != Success {
			return newError("ncclCommGetAsyncError", r, h)
		}
		if state != InProgress {
			if state != Success {
				return newError("communicator", state, h)
			}
			return nil
		}
		if timer == nil {
			timer = time.NewTimer(delay)
			defer timer.Stop()
		} else {
			timer.Reset(delay)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("nccl: waiting for the communicator: %w", ctx.Err())
		case <-timer.C:
		}
		delay = min(2*delay, 5*time.Millisecond)
	}
}

// AsyncError returns the communicator's asynchronous error
// (ncclCommGetAsyncError): nil while healthy, an error matching InProgress
// while a non-blocking operation runs, or the error that broke it (a peer
// that went away: RemoteError). A watchdog polls it; on an error, Abort.
func (c *Comm) AsyncError() error {
	h := c.h.Load()
	if h == 0 {
		return ErrClosed
	}
	state, r := cAsyncError(h)
	if r != Success {
		return newError("ncclCommGetAsyncError", r, h)
	}
	if state != Success {
		return newError("communicator", state, h)
	}
	return nil
}

// LastError returns NCCL's description of its last error (ncclGetLastError,
// NCCL 2.13), or "".
func (c *Comm) LastError() string { return cLastError(c.h.Load()) }

// Count returns the number of ranks (ncclCommCount).
func (c *Comm) Count() (int, error) { return c.query("ncclCommCount", cCount) }

// CuDevice returns the CUDA device ordinal of c (ncclCommCuDevice).
func (c *Comm) CuDevice() (int, error) { return c.query("ncclCommCuDevice", cCuDevice) }

// UserRank returns this rank (ncclCommUserRank).
func (c *Comm) UserRank() (int, error) { return c.query("ncclCommUserRank", cUserRank) }

func (c *Comm) query(op string, f func(uintptr) (int, Result)) (int, error) {
	h := c.h.Load()
	if h == 0 {
		return 0, ErrClosed
	}
	n, r := f(h)
	if r != Success {
		return 0, newError(op, r, h)
	}
	return n, nil
}

// Finalize flushes c's outstanding work and waits, with the other ranks,
// until c is quiescent (ncclCommFinalize, NCCL 2.14); Destroy then frees it
// without blocking. ctx bounds the wait of a non-blocking communicator.
func (c *Comm) Finalize(ctx context.Context) error {
	if err := c.lib.need("ncclCommFinalize"); err != nil {
		return err
	}
	h := c.h.Load()
	if h == 0 {
		return ErrClosed
	}
	if c.revoked.Load() {
		return fmt.Errorf("nccl: ncclCommFinalize after ncclCommRevoke is invalid; abort or destroy the communicator instead")
	}
	r := cFinalize(h)
	if r == InProgress || (r == Success && c.nonBlocking) {
		return c.Wait(ctx)
	}
	if r != Success {
		return newError("ncclCommFinalize", r, h)
	}
	return nil
}

// Destroy frees c (ncclCommDestroy). Without Finalize first it may wait for
// c's outstanding work. Using c afterwards returns ErrClosed. A c that a
// Shrink with ShrinkAbort came from is aborted instead: ncclCommDestroy
// can hang there (NCCL 2.31.2).
func (c *Comm) Destroy() error {
	if c.abortOnly.Load() {
		return c.Abort()
	}
	h := c.h.Swap(0)
	if h == 0 {
		return ErrClosed
	}
	defer c.release()
	if r := cDestroy(h); r != Success {
		return newError("ncclCommDestroy", r, 0)
	}
	return nil
}

// Abort stops c's outstanding work and frees it (ncclCommAbort): the way out
// of a hang or a failed peer. Using c afterwards returns ErrClosed.
func (c *Comm) Abort() error {
	h := c.h.Swap(0)
	if h == 0 {
		return ErrClosed
	}
	defer c.release()
	if r := cAbort(h); r != Success {
		return newError("ncclCommAbort", r, 0)
	}
	return nil
}

// AbortAsync is Abort with ncclCommAbort on a goroutine of its own: c is
// closed to its callers at once (ErrClosed), and the channel gets the
// abort's result. ncclCommAbort raises the communicator's abort flag first,
// which ends its kernels; joining NCCL's threads afterwards can take half a
// second, which nothing needs to wait for.
func (c *Comm) AbortAsync() <-chan error {
	done := make(chan error, 1)
	h := c.h.Swap(0)
	if h == 0 {
		done <- ErrClosed
		return done
	}
	go func() {
		defer c.release()
		if r := cAbort(h); r != Success {
			done <- newError("ncclCommAbort", r, 0)
			return
		}
		done <- nil
	}()
	return done
}

// release frees the C memory c held for NCCL.
func (c *Comm) release() {
	c.cfg.free()
	c.slot.free()
}

// The collectives take device pointers (CUdeviceptr values; send and recv
// may be equal for in-place work), an element count, and a cudaStream_t (0
// for the legacy default stream). They enqueue the work and return. A
// non-blocking communicator may answer an error matching InProgress: the
// work is being enqueued, and Wait tells when it is.

// AllReduce leaves op over every rank's count elements at send in every
// rank's recv (ncclAllReduce).
func (c *Comm) AllReduce(send, recv uintptr, count int, dt DataType, op RedOp, stream uintptr) error {
	h := c.h.Load()
	if r := cAllReduce(send, recv, count, dt, op, h, stream); r != Success {
		return c.fail("ncclAllReduce", r, h)
	}
	return nil
}

// Broadcast copies root's count elements at send into every rank's recv
// (ncclBroadcast). send matters only on root.
func (c *Comm) Broadcast(send, recv uintptr, count int, dt DataType, root int, stream uintptr) error {
	h := c.h.Load()
	if r := cBroadcast(send, recv, count, dt, root, h, stream); r != Success {
		return c.fail("ncclBroadcast", r, h)
	}
	return nil
}

// Reduce leaves op over every rank's send in root's recv (ncclReduce). recv
// matters only on root.
func (c *Comm) Reduce(send, recv uintptr, count int, dt DataType, op RedOp, root int, stream uintptr) error {
	h := c.h.Load()
	if r := cReduce(send, recv, count, dt, op, root, h, stream); r != Success {
		return c.fail("ncclReduce", r, h)
	}
	return nil
}

// AllGather concatenates every rank's sendCount elements, in rank order,
// into every rank's recv, which holds nranks×sendCount elements (ncclAllGather).
func (c *Comm) AllGather(send, recv uintptr, sendCount int, dt DataType, stream uintptr) error {
	h := c.h.Load()
	if r := cAllGather(send, recv, sendCount, dt, h, stream); r != Success {
		return c.fail("ncclAllGather", r, h)
	}
	return nil
}

// ReduceScatter reduces every rank's send (nranks×recvCount elements) and
// leaves block r of the result in rank r's recv (ncclReduceScatter).
func (c *Comm) ReduceScatter(send, recv uintptr, recvCount int, dt DataType, op RedOp, stream uintptr) error {
	h := c.h.Load()
	if r := cReduceScatter(send, recv, recvCount, dt, op, h, stream); r != Success {
		return c.fail("ncclReduceScatter", r, h)
	}
	return nil
}

// Send sends count elements at buf to rank peer, which must Recv them
// (ncclSend). A rank that both sends and receives groups the two (Group).
func (c *Comm) Send(buf uintptr, count int, dt DataType, peer int, stream uintptr) error {
	h := c.h.Load()
	if r := cSend(buf, count, dt, peer, h, stream); r != Success {
		return c.fail("ncclSend", r, h)
	}
	return nil
}

// Recv receives count elements from rank peer into buf (ncclRecv).
func (c *Comm) Recv(buf uintptr, count int, dt DataType, peer int, stream uintptr) error {
	h := c.h.Load()
	if r := cRecv(buf, count, dt, peer, h, stream); r != Success {
		return c.fail("ncclRecv", r, h)
	}
	return nil
}

// fail is the slow path of a collective.
func (c *Comm) fail(op string, r Result, h uintptr) error {
	if h == 0 {
		return ErrClosed
	}
	return newError(op, r, h)
}

// GroupStart opens a group (ncclGroupStart): the NCCL calls up to GroupEnd
// are fused, and init or collectives for several devices from one thread do
// not wait for one another. Groups are per OS thread: the goroutine must be
// locked to its thread (runtime.LockOSThread) from GroupStart to GroupEnd.
// Group does that for you.
func (l *Library) GroupStart() error {
	if r := cGroupStart(); r != Success {
		return newError("ncclGroupStart", r, 0)
	}
	return nil
}

// GroupEnd closes the group GroupStart opened and launches its work
// (ncclGroupEnd). With non-blocking communicators it may answer an error
// matching InProgress; Wait on each of them.
func (l *Library) GroupEnd() error {
	if r := cGroupEnd(); r != Success {
		return newError("ncclGroupEnd", r, 0)
	}
	return nil
}

// Group runs fn between GroupStart and GroupEnd on one locked OS thread. The
// group is ended even when fn fails; the error joins both.
func (l *Library) Group(fn func() error) (err error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := l.GroupStart(); err != nil {
		return err
	}
	defer func() {
		err = errors.Join(err, l.GroupEnd())
	}()
	return fn()
}
