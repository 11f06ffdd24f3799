package ncclcomm

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/gotrain/gotrain/gpu/cudadrv"
	"github.com/gotrain/gotrain/nccl"
	"github.com/gotrain/gotrain/worker/comm"
)

const (
	// pollSpin is how long wait polls the stream without pausing: a
	// collective of up to a few MiB finishes within it.
	pollSpin = 5 * time.Millisecond
	// pollPause is the pause between polls after pollSpin.
	pollPause = 20 * time.Microsecond
	// closeTimeout bounds ncclCommFinalize in Close; then Close aborts.
	closeTimeout = 10 * time.Second
)

// launchFn enqueues one NCCL collective on the stream from device pointers.
type launchFn func(send, recv uintptr) error

// AllReduce leaves op over every rank's send in every rank's recv and returns
// when the result is in recv. Device buffers go to NCCL as they are; host
// buffers are staged through device memory.
func (c *Comm) AllReduce(ctx context.Context, send, recv comm.Buffer, op comm.Op) error {
	l, err := c.allReduce(send, recv, op)
	if err != nil {
		return c.errorf("AllReduce", c.seq.Load()+1, err)
	}
	return c.run(ctx, "AllReduce", send, recv, false, l)
}

// Broadcast copies root's buf into every other rank's buf.
func (c *Comm) Broadcast(ctx context.Context, buf comm.Buffer, root int) error {
	l, err := c.broadcast(buf, root)
	if err != nil {
		return c.errorf("Broadcast", c.seq.Load()+1, err)
	}
	return c.run(ctx, "Broadcast", buf, buf, true, l)
}

// AllGather concatenates every rank's send, in rank order, into recv.
func (c *Comm) AllGather(ctx context.Context, send, recv comm.Buffer) error {
	l, err := c.allGather(send, recv)
	if err != nil {
		return c.errorf("AllGather", c.seq.Load()+1, err)
	}
	return c.run(ctx, "AllGather", send, recv, false, l)
}

// ReduceScatter reduces send over every rank and leaves block r of the
// result in rank r's recv.
func (c *Comm) ReduceScatter(ctx context.Context, send, recv comm.Buffer, op comm.Op) error {
	l, err := c.reduceScatter(send, recv, op)
	if err != nil {
		return c.errorf("ReduceScatter", c.seq.Load()+1, err)
	}
	return c.run(ctx, "ReduceScatter", send, recv, false, l)
}

// Barrier returns when every rank has entered it: an all-reduce of one
// element on the device.
func (c *Comm) Barrier(ctx context.Context) error {
	b := comm.Device(uintptr(c.barrier), 1, comm.Int32)
	return c.AllReduce(ctx, b, b, comm.Sum)
}

// The Async variants take device buffers only. They enqueue the collective
// on Stream and return without waiting for it: order other streams after it
// with an event recorded on Stream (inside Do), or call Synchronize. The
// buffers must stay untouched until the collective is complete.

// AllReduceAsync enqueues AllReduce on Stream.
func (c *Comm) AllReduceAsync(send, recv comm.Buffer, op comm.Op) error {
	l, err := c.allReduce(send, recv, op)
	return c.enqueue("AllReduce", send, recv, l, err)
}

// BroadcastAsync enqueues Broadcast on Stream.
func (c *Comm) BroadcastAsync(buf comm.Buffer, root int) error {
	l, err := c.broadcast(buf, root)
	return c.enqueue("Broadcast", buf, buf, l, err)
}

// AllGatherAsync enqueues AllGather on Stream.
func (c *Comm) AllGatherAsync(send, recv comm.Buffer) error {
	l, err := c.allGather(send, recv)
	return c.enqueue("AllGather", send, recv, l, err)
}

// ReduceScatterAsync enqueues ReduceScatter on Stream.
func (c *Comm) ReduceScatterAsync(send, recv comm.Buffer, op comm.Op) error {
	l, err := c.reduceScatter(send, recv, op)
	return c.enqueue("ReduceScatter", send, recv, l, err)
}

// Synchronize waits until the work enqueued on Stream is complete. When ctx
// ends first, or NCCL reports an error (a peer failed), it aborts the
// communicator, which then answers every call with an error.
func (c *Comm) Synchronize(ctx context.Context) error {
	if c.closed.Load() {
		return comm.ErrClosed
	}
	defer c.abortWhenDone(ctx)()
	err := c.exec.Do(func() error { return c.wait(ctx) })
	if err != nil {
		return c.errorf("Synchronize", c.seq.Load(), err)
	}
	return nil
}

func (c *Comm) allReduce(send, recv comm.Buffer, op comm.Op) (launchFn, error) {
	if err := comm.CheckShapes("AllReduce", send, recv, 1); err != nil {
		return nil, err
	}
	dt, rop, err := ncclTypes(send.DType(), op)
	if err != nil {
		return nil, err
	}
	n := send.Len()
	return func(s, r uintptr) error { return c.nc.AllReduce(s, r, n, dt, rop, uintptr(c.stream)) }, nil
}

func (c *Comm) broadcast(buf comm.Buffer, root int) (launchFn, error) {
	if root < 0 || root >= c.size {
		return nil, fmt.Errorf("root %d is out of range for %d ranks", root, c.size)
	}
	dt, err := NCCLType(buf.DType())
	if err != nil {
		return nil, err
	}
	n := buf.Len()
	return func(s, r uintptr) error { return c.nc.Broadcast(s, r, n, dt, root, uintptr(c.stream)) }, nil
}

func (c *Comm) allGather(send, recv comm.Buffer) (launchFn, error) {
	if err := comm.CheckShapes("AllGather", send, recv, c.size); err != nil {
		return nil, err
	}
	dt, err := NCCLType(send.DType())
	if err != nil {
		return nil, err
	}
	n := send.Len()
	return func(s, r uintptr) error { return c.nc.AllGather(s, r, n, dt, uintptr(c.stream)) }, nil
}

func (c *Comm) reduceScatter(send, recv comm.Buffer, op comm.Op) (launchFn, error) {
	if send.DType() != recv.DType() {
		return nil, fmt.Errorf("send is %s but recv is %s", send.DType(), recv.DType())
	}
	if send.Len() != recv.Len()*c.size {
		return nil, fmt.Errorf("send holds %d elements, want %d (recv %d × %d ranks)", send.Len(), recv.Len()*c.size, recv.Len(), c.size)
	}
	dt, rop, err := ncclTypes(send.DType(), op)
	if err != nil {
		return nil, err
	}
	n := recv.Len()
	return func(s, r uintptr) error { return c.nc.ReduceScatter(s, r, n, dt, rop, uintptr(c.stream)) }, nil
}

func ncclTypes(d comm.DType, o comm.Op) (nccl.DataType, nccl.RedOp, error) {
	dt, err := NCCLType(d)
	if err != nil {
		return 0, 0, err
	}
	rop, err := NCCLOp(o)
	return dt, rop, err
}

// launch calls l and, on a non-blocking communicator that answers
// InProgress, waits until NCCL has enqueued the work.
func (c *Comm) launch(ctx context.Context, l launchFn, send, recv uintptr) error {
	err := l(send, recv)
	if errors.Is(err, nccl.InProgress) {
		err = c.nc.Wait(ctx)
	}
	return err
}

// enqueue runs an Async collective on the thread.
func (c *Comm) enqueue(op string, send, recv comm.Buffer, l launchFn, err error) error {
	seq := c.seq.Add(1)
	if err == nil && (!send.OnDevice() || !recv.OnDevice()) {
		err = errors.New("the Async collectives take device buffers (comm.Device); use the synchronous one for host memory")
	}
	if err == nil && c.closed.Load() {
		err = comm.ErrClosed
	}
	if err == nil {
		err = c.exec.Do(func() error {
			return c.launch(context.Background(), l, send.DevicePointer(), recv.DevicePointer())
		})
	}
	if err != nil {
		return c.errorf(op, seq, err)
	}
	return nil
}

// run carries out one synchronous collective on the thread: stage host
// buffers in, launch, wait for the stream, copy host results out. inPlace
// stages send and recv (the same host buffer) in one place.
func (c *Comm) run(ctx context.Context, op string, send, recv comm.Buffer, inPlace bool, l launchFn) error {
	seq := c.seq.Add(1)
	if c.closed.Load() {
		return c.errorf(op, seq, comm.ErrClosed)
	}
	defer c.abortWhenDone(ctx)()
	err := c.exec.Do(func() error {
		sp, rp, err := c.stage(send, recv, inPlace)
		if err != nil {
			return err
		}
		if err := c.launch(ctx, l, sp, rp); err != nil {
			return err
		}
		if err := c.wait(ctx); err != nil {
			return err
		}
		if !recv.OnDevice() && recv.Len() > 0 {
			if err := cudadrv.CopyFromDevice(recv.HostBytes(), cudadrv.DevicePtr(rp)); err != nil {
				return fmt.Errorf("copy the result to host memory: %w", err)
			}
		}
		return nil
	})
	if err != nil {
		return c.errorf(op, seq, err)
	}
	return nil
}

// stage returns the device addresses of send and recv, copying a host send
// into the scratch buffer (on the stream, so in order with the collective).
func (c *Comm) stage(send, recv comm.Buffer, inPlace bool) (sp, rp uintptr, err error) {
	need := 0
	if !send.OnDevice() {
		need += send.Bytes()
	}
	if !recv.OnDevice() && !inPlace {
		need += recv.Bytes()
	}
	if need > c.scratchBytes {
		if err := c.growScratch(need); err != nil {
			return 0, 0, err
		}
	}
	off := uintptr(c.scratch)
	if send.OnDevice() {
		sp = send.DevicePointer()
	} else {
		sp = off
		off += uintptr(send.Bytes())
		if send.Len() > 0 {
			if err := cudadrv.CopyToDeviceAsync(cudadrv.DevicePtr(sp), send.HostBytes(), c.stream); err != nil {
				return 0, 0, fmt.Errorf("copy the input to the device: %w", err)
			}
		}
	}
	switch {
	case recv.OnDevice():
		rp = recv.DevicePointer()
	case inPlace:
		rp = sp
	default:
		rp = off
	}
	return sp, rp, nil
}

// growScratch replaces the scratch buffer with one of at least n bytes,
// rounded up to a power of two so that growing sizes reallocate rarely.
func (c *Comm) growScratch(n int) error {
	size := 1 << 20
	for size < n {
		size *= 2
	}
	if c.scratch != 0 {
		if err := c.stream.Synchronize(); err != nil {
			return err
		}
		c.scratch.Free()
		c.scratch, c.scratchBytes = 0, 0
	}
	p, err := cudadrv.MemAlloc(size)
	if err != nil {
		return fmt.Errorf("allocate %d bytes of device memory to stage host buffers: %w", size, err)
	}
	c.scratch, c.scratchBytes = p, size
	return nil
}

// abortWhenDone aborts the communicator from another goroutine if ctx ends
// before the returned stop is called. NCCL can block inside a call (the
// first collective of an algorithm connects to the peers, and waits for
// them); ncclCommAbort from another thread makes it return, as PyTorch's
// watchdog does. A context that never ends costs nothing.
func (c *Comm) abortWhenDone(ctx context.Context) (stop func()) {
	if ctx.Done() == nil {
		return func() {}
	}
	s := context.AfterFunc(ctx, func() {
		c.log.Warn("context ended during a collective: aborting the NCCL communicator", "err", ctx.Err())
		c.abortInBackground()
	})
	return func() { s() }
}

// abortInBackground starts ncclCommAbort and returns at once: the
// communicator is closed to collectives from now on and its kernels stop as
// soon as NCCL raises its abort flag, but the rest of ncclCommAbort (joining
// NCCL's threads, now and then half a second) runs on a goroutine, so that
// a failed collective returns and recovery starts without waiting for it.
// abortMu is held until it is done; Close waits for it. Nothing is started
// when an abort is already running.
func (c *Comm) abortInBackground() {
	if !c.abortMu.TryLock() {
		return // an abort is in flight
	}
	c.runAbortHooks()
	done := c.nc.AbortAsync()
	go func() {
		<-done
		c.abortMu.Unlock()
	}()
}

// wait polls the stream until its work is complete, like nccl-tests: a
// stream synchronize could block forever on a collective whose peer is gone,
// while polling also watches ctx and NCCL's asynchronous error. It spins for
// pollSpin, then pauses pollPause between polls. When ctx ends or NCCL
// reports an error it aborts the communicator, which ends the stuck kernel.
func (c *Comm) wait(ctx context.Context) error {
	var start time.Time
	for i := 0; ; i++ {
		done, err := c.stream.Done()
		if err != nil {
			return err
		}
		if done {
			return nil
		}
		if i%64 != 63 {
			continue
		}
		if start.IsZero() {
			start = time.Now()
		}
		if err := ctx.Err(); err != nil {
			c.abortInBackground()
			return fmt.Errorf("collective did not complete: %w (the NCCL communicator was aborted)", err)
		}
		if err := c.nc.AsyncError(); err != nil && !errors.Is(err, nccl.InProgress) {
			c.abortInBackground()
			return fmt.Errorf("%w (the NCCL communicator was aborted)", err)
		}
		if time.Since(start) > pollSpin {
			time.Sleep(pollPause)
		}
	}
}

// Abort stops the NCCL communicator's work and frees it (ncclCommAbort): a
// collective in progress, on any goroutine, returns with an error, and so do
// later ones. Call it from another goroutine to break a hang; Close still
// releases the thread and the device.
func (c *Comm) Abort() error {
	if c.nc == nil {
		return nil
	}
	// Close waits for an abort in flight before it tears down the stream
	// and the thread (ncclCommAbort may take a while to join NCCL's threads).
	c.abortMu.Lock()
	defer c.abortMu.Unlock()
	c.runAbortHooks()
	if err := c.nc.Abort(); err != nil && !errors.Is(err, nccl.ErrClosed) {
		return fmt.Errorf("ncclcomm: rank %d: abort: %w", c.rank, err)
	}
	return nil
}

// Close finalizes and destroys the NCCL communicator (aborting it when
// finalize fails or takes longer than closeTimeout), frees the device memory
// and the stream, releases the primary context and ends the thread. It does
// not wait for peers. Later calls return comm.ErrClosed.
func (c *Comm) Close() error {
	c.closeMu.Lock()
	defer c.closeMu.Unlock()
	if c.closed.Swap(true) {
		return nil
	}
	err := c.exec.Do(func() error {
		if c.nc.Handle() == 0 {
			return nil // aborted
		}
		if c.lib.Has("ncclCommFinalize") {
			ctx, cancel := context.WithTimeout(context.Background(), closeTimeout)
			defer cancel()
			if err := c.nc.Finalize(ctx); err != nil {
				c.nc.Abort()
				return fmt.Errorf("finalize (aborted instead): %w", err)
			}
		}
		return c.nc.Destroy()
	})
	c.abortMu.Lock() // an Abort from another goroutine has finished
	//lint:ignore SA2001 the lock is only a wait for that Abort
	c.abortMu.Unlock()
	c.exec.Stop()
	if err != nil {
		return fmt.Errorf("ncclcomm: rank %d: close comm %q: %w", c.rank, c.name, err)
	}
	return nil
}
