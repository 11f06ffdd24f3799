package flight

import (
	"context"

	"github.com/gotrain/gotrain/worker/comm"
)

// Tracker is implemented by backends whose collectives complete after the
// call returns (NCCL work enqueued on a CUDA stream). [Wrap] hands such a
// backend its recorder. The wrapper then records each collective as
// enqueued when the call is made, and as failed when the call returns an
// error; the backend calls [Recorder.Start] and [Recorder.Complete] with the
// collective's seq ([Recorder.Issued] inside the call) when it sees the work
// begin and end, for instance from a watchdog goroutine polling CUDA events.
// An asynchronous error found later (ncclCommGetAsyncError) goes to
// [Recorder.Fail].
type Tracker interface {
	TrackWith(r *Recorder)
}

// Comm is a comm.Comm that records every collective of the backend it wraps.
type Comm struct {
	inner comm.Comm
	rec   *Recorder
	async bool // the backend completes collectives itself (Tracker)
}

var _ comm.Comm = (*Comm)(nil)

// Wrap returns c recording into rec.
func Wrap(c comm.Comm, rec *Recorder) *Comm {
	w := &Comm{inner: c, rec: rec}
	if t, ok := c.(Tracker); ok {
		t.TrackWith(rec)
		w.async = true
	}
	return w
}

// Unwrap returns the backend, for its own methods (NCCL's Async variants).
func (c *Comm) Unwrap() comm.Comm { return c.inner }

// Recorder returns the communicator's flight recorder.
func (c *Comm) Recorder() *Recorder { return c.rec }

func (c *Comm) Rank() int { return c.inner.Rank() }
func (c *Comm) Size() int { return c.inner.Size() }

func (c *Comm) enter(op Op, dt comm.DType, reduce comm.Op, count int, peer int) uint64 {
	return c.rec.Enqueue(op, dt, reduce, int64(count), peer, 0, !c.async)
}

func (c *Comm) done(seq uint64, err error) error {
	switch {
	case err != nil:
		c.rec.Fail(seq, err)
	case !c.async:
		c.rec.Complete(seq)
	}
	return err
}

func (c *Comm) AllReduce(ctx context.Context, send, recv comm.Buffer, op comm.Op) error {
	seq := c.enter(OpAllReduce, send.DType(), op, send.Len(), -1)
	return c.done(seq, c.inner.AllReduce(ctx, send, recv, op))
}

func (c *Comm) Broadcast(ctx context.Context, buf comm.Buffer, root int) error {
	seq := c.enter(OpBroadcast, buf.DType(), 0, buf.Len(), root)
	return c.done(seq, c.inner.Broadcast(ctx, buf, root))
}

func (c *Comm) AllGather(ctx context.Context, send, recv comm.Buffer) error {
	seq := c.enter(OpAllGather, send.DType(), 0, send.Len(), -1)
	return c.done(seq, c.inner.AllGather(ctx, send, recv))
}

func (c *Comm) ReduceScatter(ctx context.Context, send, recv comm.Buffer, op comm.Op) error {
	seq := c.enter(OpReduceScatter, recv.DType(), op, recv.Len(), -1)
	return c.done(seq, c.inner.ReduceScatter(ctx, send, recv, op))
}

func (c *Comm) Barrier(ctx context.Context) error {
	seq := c.enter(OpBarrier, comm.Int32, 0, 0, -1)
	return c.done(seq, c.inner.Barrier(ctx))
}

func (c *Comm) Close() error { return c.inner.Close() }
