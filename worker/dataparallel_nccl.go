package worker

import (
	"context"
	"errors"
	"fmt"

	"github.com/gotrain/gotrain/gpu/cudadrv"
	"github.com/gotrain/gotrain/nccl"
	"github.com/gotrain/gotrain/worker/ncclcomm"
	"github.com/gotrain/gotrain/worker/nodereduce"
	"github.com/gotrain/gotrain/worker/pairreduce"
)

// deviceEngine reduces device buffers with NCCL on the communicator's
// stream, ordered against the caller's compute stream with CUDA events: for
// each bucket an event recorded on the compute stream when the bucket is
// ready, which the communication stream waits for before the all-reduce;
// after the last bucket one event on the communication stream, which the
// compute stream waits for. Every CUDA and NCCL call runs on the
// communicator's thread (ncclcomm.Comm.Do), where the device's primary
// context is current.
//
// AfterReduce (the optimizer) runs on a third stream of its own, which waits
// for the bucket's reduction (and, with DeferUpdate, its release): on the
// communication stream it would hold the next bucket's all-reduce back by
// the update's length, and the last buckets' updates and reductions, which
// nothing else overlaps, would queue behind each other at the end of the
// step (measured on 2 × H200: ~60 µs of the ~260 µs after backward).
// The serial-update knob (TuningEnv) keeps the old order; high-priority-update
// gives the stream the device's greatest priority (see newUpdateStream).
type deviceEngine struct {
	dp      *DataParallel
	nc      *ncclcomm.Comm
	compute cudadrv.Stream
	readyEv []cudadrv.Event // per bucket
	relEv   []cudadrv.Event // per bucket, with DeferUpdate: released
	doneEv  cudadrv.Event
	bf16    cudadrv.DevicePtr // staging of the largest bucket as bfloat16

	// The update stream (0: updates run on the communication stream), the
	// event after each bucket's reduction that it waits for, and the
	// event after its last update that the compute stream waits for.
	upd       cudadrv.Stream
	reducedEv []cudadrv.Event
	updDoneEv cudadrv.Event

	// The copy-engine transport (nil: NCCL): the stream of the copies to
	// the peer, the stream of the sums (each records reducedEv), the event
	// after each bucket's copy, and the abort hook that releases streams
	// waiting for a peer that is gone.
	pair       *pairreduce.Pair
	node       *nodereduce.Node // more than two ranks (nil: pair or NCCL)
	ce         copyEngine       // pair or node, nil with NCCL
	copyStream cudadrv.Stream
	sumStream  cudadrv.Stream
	sentEv     []cudadrv.Event
	sentDoneEv cudadrv.Event // the copy stream's end of a step
	removeHook func()

	// stepEv is a ring of marks of the compute stream's end of a step's
	// communication, recorded at each finish (steps so far): the flight
	// recorder's tracker completes a step's reductions when its mark has
	// passed, and with the pair finish waits for the previous step's
	// (boundRunAhead). Empty when neither is needed.
	stepEv  []cudadrv.Event
	steps   int
	tracker *reduceTracker // nil when the communicator has no recorder
}

func newDeviceEngine(ctx context.Context, dp *DataParallel) (*deviceEngine, error) {
	nc, ok := unwrap(dp.c).(*ncclcomm.Comm)
	if !ok {
		return nil, fmt.Errorf("worker: DataParallel: gradients in device memory need the NCCL backend (the communicator is %T; use --backend nccl)", unwrap(dp.c))
	}
	if dp.cfg.Kernels == nil && (dp.cfg.BF16 || dp.cfg.AccumulationSteps > 1) {
		return nil, errors.New("worker: DataParallel: BF16 and AccumulationSteps > 1 on a GPU need DataParallelConfig.Kernels")
	}
	e := &deviceEngine{dp: dp, nc: nc, compute: cudadrv.Stream(dp.cfg.Stream), readyEv: make([]cudadrv.Event, len(dp.bkts))}
	if err := e.openPair(ctx); err != nil {
		return nil, err
	}
	if dp.cfg.DeferUpdate && dp.cfg.AfterReduce != nil {
		e.relEv = make([]cudadrv.Event, len(dp.bkts))
	}
	// The copy engines' reducedEv events are recorded on the sum stream.
	separate := e.ce != nil || (dp.cfg.AfterReduce != nil && !dp.tune.serialUpdate)
	if separate {
		e.reducedEv = make([]cudadrv.Event, len(dp.bkts))
	}
	if e.ce != nil {
		e.sentEv = make([]cudadrv.Event, len(dp.bkts))
	}
	rec := recorderOf(dp.c)
	if rec != nil || e.ce != nil {
		e.stepEv = make([]cudadrv.Event, stepMarks)
	}
	err := nc.Do(func() error { return e.createResources(separate) })
	if err != nil {
		e.close()
		return nil, fmt.Errorf("worker: DataParallel: %w", err)
	}
	if rec != nil {
		e.tracker = newReduceTracker(rec, e.nc.Do, stepMarks)
	}
	return e, nil
}

// createResources creates, on the communicator's thread, the update
// stream (separate) and the copy-engine transport's streams, the events
// and the bfloat16 staging buffer.
func (e *deviceEngine) createResources(separate bool) error {
	if separate {
		var err error
		if e.upd, err = newUpdateStream(e.dp.tune.highPriorityUpdate); err != nil {
			return fmt.Errorf("create the update stream: %w", err)
		}
		if e.updDoneEv, err = cudadrv.NewEvent(cudadrv.EventDisableTiming); err != nil {
			return err
		}
	}
	if e.ce != nil {
		if err := e.createCopyStreams(); err != nil {
			return err
		}
	}
	for _, evs := range [][]cudadrv.Event{e.readyEv, e.relEv, e.reducedEv, e.sentEv, e.stepEv} {
		for i := range evs {
			ev, err := cudadrv.NewEvent(cudadrv.EventDisableTiming)
			if err != nil {
				return err
			}
			evs[i] = ev
		}
	}
	var err error
	if e.doneEv, err = cudadrv.NewEvent(cudadrv.EventDisableTiming); err != nil {
		return err
	}
	if e.dp.cfg.BF16 {
		largest := 0
		for _, b := range e.dp.bkts {
			largest = max(largest, b.Len)
		}
		if e.bf16, err = cudadrv.MemAlloc(2 * largest); err != nil {
			return fmt.Errorf("allocate the bfloat16 staging buffer: %w", err)
		}
	}
	return nil
}

// createCopyStreams creates the copy-engine transport's copy and sum
// streams and the event of the copies' end.
func (e *deviceEngine) createCopyStreams() error {
	var err error
	if e.copyStream, err = cudadrv.NewStream(cudadrv.StreamNonBlocking); err != nil {
		return fmt.Errorf("create the copy stream: %w", err)
	}
	if e.sumStream, err = cudadrv.NewStream(cudadrv.StreamNonBlocking); err != nil {
		return fmt.Errorf("create the sum stream: %w", err)
	}
	e.sentDoneEv, err = cudadrv.NewEvent(cudadrv.EventDisableTiming)
	return err
}

// commStream is the communicator's stream, where NCCL's collectives run.
func (e *deviceEngine) commStream() cudadrv.Stream { return cudadrv.Stream(e.nc.Stream()) }

// stepMarks is how many steps' end marks the engine keeps: as many steps'
// reductions as the flight recorder's tracker follows at once.
const stepMarks = 8

func (e *deviceEngine) launch(ctx context.Context, b int, update bool) error {
	if e.tracker != nil {
		e.tracker.launched(e.dp.bkts[b].Len, e.nc.Stream())
	}
	if e.ce != nil {
		return e.launchPair(b, update)
	}
	dp := e.dp
	bk := dp.bkts[b]
	g := dp.grads.DevicePointer() + uintptr(4*bk.Offset)
	return e.nc.Do(func() error {
		s := e.commStream()
		if err := e.readyEv[b].Record(e.compute); err != nil {
			return err
		}
		if err := s.WaitEvent(e.readyEv[b]); err != nil {
			return err
		}
		if err := e.reduce(bk, g, s); err != nil {
			return err
		}
		if e.upd == 0 {
			if update {
				return dp.cfg.AfterReduce(bk, uintptr(s))
			}
			return nil
		}
		return e.afterReduced(b, s, update)
	})
}

// afterReduced marks bucket b reduced by the work enqueued on s so far and,
// when update is set, enqueues its AfterReduce on the update stream behind
// that mark. It runs inside Do.
func (e *deviceEngine) afterReduced(b int, s cudadrv.Stream, update bool) error {
	if err := e.reducedEv[b].Record(s); err != nil {
		return err
	}
	if !update {
		return nil
	}
	if err := e.upd.WaitEvent(e.reducedEv[b]); err != nil {
		return err
	}
	return e.dp.cfg.AfterReduce(e.dp.bkts[b], uintptr(e.upd))
}

// newUpdateStream creates the stream of the buckets' updates, with the
// device's greatest priority when urgent: each update then runs as soon as
// its reduction is done instead of waiting for the GEMM beside it to hand
// out its last blocks, but takes its SMs from that GEMM.
func newUpdateStream(urgent bool) (cudadrv.Stream, error) {
	if !urgent {
		return cudadrv.NewStream(cudadrv.StreamNonBlocking)
	}
	_, greatest, err := cudadrv.StreamPriorityRange()
	if err != nil {
		return 0, err
	}
	return cudadrv.NewStreamWithPriority(cudadrv.StreamNonBlocking, greatest)
}

// update enqueues bucket b's AfterReduce after its reduction (enqueued
// before) and after the work enqueued on the compute stream so far (the last
// reads of the bucket's parameters): on the update stream, or behind the
// reduction on the communication stream with the serial-update knob.
func (e *deviceEngine) update(ctx context.Context, b int) error {
	return e.nc.Do(func() error {
		s := e.commStream()
		fused := e.pair != nil && e.dp.cfg.FusedSum
		if e.upd != 0 {
			if !fused { // else fusedUpdate waits for the peer's copy
				if err := e.upd.WaitEvent(e.reducedEv[b]); err != nil {
					return err
				}
			}
			s = e.upd
		}
		if err := e.relEv[b].Record(e.compute); err != nil {
			return err
		}
		if err := s.WaitEvent(e.relEv[b]); err != nil {
			return err
		}
		if fused {
			return e.fusedUpdate(b)
		}
		return e.dp.cfg.AfterReduce(e.dp.bkts[b], uintptr(s))
	})
}

// reduce enqueues the reduction of bucket bk (at g) on s.
func (e *deviceEngine) reduce(bk Bucket, g uintptr, s cudadrv.Stream) error {
	dp := e.dp
	comm := e.nc.NCCL()
	if dp.c.Size() == 1 && !dp.cfg.BF16 { // one rank: the sum is the gradient
		if dp.cfg.AccumulationSteps > 1 {
			return dp.cfg.Kernels.Scale(g, bk.Len, dp.postScale(), uintptr(s))
		}
		return nil
	}
	if !dp.cfg.BF16 {
		if err := comm.AllReduce(g, g, bk.Len, nccl.Float32, nccl.Avg, uintptr(s)); err != nil {
			return err
		}
		if dp.cfg.AccumulationSteps > 1 {
			return dp.cfg.Kernels.Scale(g, bk.Len, dp.postScale(), uintptr(s))
		}
		return nil
	}
	h := uintptr(e.bf16)
	if err := dp.cfg.Kernels.ToBF16(h, g, bk.Len, uintptr(s)); err != nil {
		return err
	}
	if err := comm.AllReduce(h, h, bk.Len, nccl.BFloat16, nccl.Sum, uintptr(s)); err != nil {
		return err
	}
	scale := dp.meanScale()
	return dp.cfg.Kernels.FromBF16(g, h, bk.Len, scale, uintptr(s))
}

func (e *deviceEngine) finish(ctx context.Context) error {
	err := e.nc.Do(func() error {
		last := e.commStream()
		if e.ce != nil {
			e.ce.Next()
			// Every copy is done (the sums waited for them; with FusedSum
			// there are none, and the copy stream is waited for here).
			if err := e.sentDoneEv.Record(e.copyStream); err != nil {
				return err
			}
			if err := e.compute.WaitEvent(e.sentDoneEv); err != nil {
				return err
			}
			last = e.sumStream
		}
		if err := e.doneEv.Record(last); err != nil {
			return err
		}
		if err := e.compute.WaitEvent(e.doneEv); err != nil {
			return err
		}
		if e.upd != 0 {
			if err := e.updDoneEv.Record(e.upd); err != nil {
				return err
			}
			if err := e.compute.WaitEvent(e.updDoneEv); err != nil {
				return err
			}
		}
		if len(e.stepEv) == 0 {
			return nil
		}
		mark := e.stepEv[e.steps%len(e.stepEv)]
		e.steps++
		if err := mark.Record(e.compute); err != nil {
			return err
		}
		if e.tracker != nil {
			e.tracker.stepEnd(mark)
		}
		return nil
	})
	if err != nil || e.ce == nil {
		return err
	}
	return e.boundRunAhead(ctx)
}

func (e *deviceEngine) broadcast(ctx context.Context, params Buffer) error {
	if err := e.nc.Do(e.compute.Synchronize); err != nil {
		return err
	}
	return e.dp.c.Broadcast(ctx, params, 0)
}

func (e *deviceEngine) close() error {
	if e.tracker != nil {
		e.tracker.close()
	}
	e.closePair()
	return e.nc.Do(func() error {
		e.commStream().Synchronize()
		if e.upd != 0 {
			e.upd.Synchronize()
			e.upd.Destroy()
		}
		for _, s := range []cudadrv.Stream{e.copyStream, e.sumStream} {
			if s != 0 {
				s.Synchronize()
				s.Destroy()
			}
		}
		for _, evs := range [][]cudadrv.Event{e.readyEv, e.relEv, e.reducedEv, e.sentEv, e.stepEv, {e.doneEv, e.updDoneEv, e.sentDoneEv}} {
			for _, ev := range evs {
				if ev != 0 {
					ev.Destroy()
				}
			}
		}
		if e.bf16 != 0 {
			e.bf16.Free()
		}
		return nil
	})
}
