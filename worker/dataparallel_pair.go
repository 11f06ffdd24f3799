package worker

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/gotrain/gotrain/internal/peermem"
	"github.com/gotrain/gotrain/worker/nodereduce"
	"github.com/gotrain/gotrain/worker/pairreduce"
)

// The copy-engine transport of deviceEngine (package pairreduce for two
// ranks, nodereduce for more): each bucket is copied to the peer (its chunks
// to their owners) on the copy stream as soon as backward has
// produced it; its sum with the peer's copy runs on the sum stream once the
// peer's copy has arrived and this rank's own has left (the sum overwrites
// the gradients the copy reads), and AfterReduce after it on the update
// stream.

// pairCloseWait bounds how long close waits for the streams before it
// releases them (the peer is gone) and for the peer to reach its own close.
const pairCloseWait = 5 * time.Second

// copyEngine is what the two copy-engine transports (pairreduce for two
// ranks, nodereduce for more) have in common.
type copyEngine interface {
	Next()
	Release()
	Close() error
}

// openPair sets up the copy-engine transport when the config allows it and
// the ranks can map each other's memory: package pairreduce for two ranks,
// nodereduce for more. With TransportAuto it falls back to NCCL (and says
// why) when they cannot, and past two ranks it takes the copy engines only
// where ranks share a GPU (NCCL's kernels there take turns in time slices).
func (e *deviceEngine) openPair(ctx context.Context) error {
	dp := e.dp
	want := dp.cfg.Transport
	if want == TransportNCCL || dp.c.Size() < 2 || (want == TransportAuto && dp.cfg.BF16) {
		return nil
	}
	var err error
	if dp.c.Size() == 2 {
		var p *pairreduce.Pair
		p, err = pairreduce.Open(ctx, e.nc, e.nc.Do,
			pairreduce.Config{Elements: dp.grads.Len(), Buckets: len(dp.bkts), Lanes: dp.tune.lanes})
		if err == nil {
			e.pair, e.ce = p, p
		}
	} else {
		spans := make([]nodereduce.Span, len(dp.bkts))
		for i, b := range dp.bkts {
			spans[i] = nodereduce.Span{Offset: b.Offset, Len: b.Len}
		}
		var n *nodereduce.Node
		n, err = nodereduce.Open(ctx, e.nc, e.nc.Do, nodereduce.Config{
			Grads: dp.grads.DevicePointer(), Buckets: spans, SharedGPUOnly: want == TransportAuto})
		if err == nil {
			e.node, e.ce = n, n
		}
	}
	var un *peermem.UnavailableError // pairreduce's and nodereduce's
	switch {
	case err == nil:
		ce := e.ce
		e.removeHook = e.nc.OnAbort(func() {
			dp.log.Warn("the communicator was aborted: releasing the copy-engine transport's waits on the GPU", "rank", dp.c.Rank())
			ce.Release()
		})
		dp.log.Info("gradients are averaged over the copy engines", "rank", dp.c.Rank(), "ranks", dp.c.Size(), "transport", TransportCopyEngine)
		return nil
	case errors.As(err, &un) && want == TransportAuto:
		dp.log.Info("gradients are averaged with NCCL", "rank", dp.c.Rank(), "transport", TransportNCCL, "why_not_copy_engine", un.Reason)
		return nil
	default:
		return fmt.Errorf("worker: DataParallel: %w", err)
	}
}

func (e *deviceEngine) launchPair(b int, update bool) error {
	dp := e.dp
	bk := dp.bkts[b]
	g := dp.grads.DevicePointer()
	scale := dp.meanScale()
	return e.nc.Do(func() error {
		if err := e.readyEv[b].Record(e.compute); err != nil {
			return err
		}
		if err := e.copyStream.WaitEvent(e.readyEv[b]); err != nil {
			return err
		}
		if e.node != nil {
			// The sum writes only this rank's chunk, which no copy of
			// Send reads: it waits for the bucket to be ready, not for
			// the copies. (The peers' copies alone do not order it after
			// this rank's backward: without the wait it could add before
			// backward wrote the chunk, which backward then overwrites.)
			if err := e.node.Send(b, uintptr(e.copyStream)); err != nil {
				return err
			}
			if err := e.sumStream.WaitEvent(e.readyEv[b]); err != nil {
				return err
			}
			if err := e.node.Reduce(b, scale, uintptr(e.sumStream)); err != nil {
				return err
			}
			return e.afterReduced(b, e.sumStream, update)
		}
		if err := e.pair.Send(b, bk.Offset, bk.Len, g, uintptr(e.copyStream)); err != nil {
			return err
		}
		if err := e.sentEv[b].Record(e.copyStream); err != nil {
			return err
		}
		if dp.cfg.FusedSum {
			if !update {
				return nil // update (after the release) does it all
			}
			return e.fusedUpdate(b)
		}
		// The sum has a stream of its own: behind the previous bucket's
		// update on the update stream, the last bucket's sum would wait
		// for an update that overlaps backward's last GEMM.
		if err := e.sumStream.WaitEvent(e.sentEv[b]); err != nil {
			return err
		}
		if err := e.pair.Sum(b, bk.Offset, bk.Len, g, scale, uintptr(e.sumStream)); err != nil {
			return err
		}
		return e.afterReduced(b, e.sumStream, update)
	})
}

// fusedUpdate enqueues on the update stream, once the peer's copy of
// bucket b has arrived, AfterReduce with the peer's gradients in
// Bucket.Peer, then tells the peer its copy has been read. The update does
// not write the gradients, so it need not wait for this rank's copy to
// leave (finish orders the next backward after it).
func (e *deviceEngine) fusedUpdate(b int) error {
	dp := e.dp
	if err := e.pair.Arrived(b, uintptr(e.upd)); err != nil {
		return err
	}
	bk := dp.bkts[b]
	bk.Peer = e.pair.Inbox(bk.Offset)
	bk.Scale = dp.meanScale()
	if err := dp.cfg.AfterReduce(bk, uintptr(e.upd)); err != nil {
		return err
	}
	return e.pair.Consumed(b, uintptr(e.upd))
}

// closePair waits for this rank's copies and sums (releasing them if the
// peer is gone), then for the peer to get as far (a barrier, which fails at
// once on an aborted communicator), so that neither rank frees memory the
// other still writes into.
func (e *deviceEngine) closePair() {
	if e.ce == nil {
		return
	}
	e.removeHook()
	deadline := time.Now().Add(pairCloseWait)
	idle := func() bool {
		var done bool
		_ = e.nc.Do(func() error {
			a, _ := e.copyStream.Done()
			b, _ := e.sumStream.Done()
			c, _ := e.upd.Done()
			done = a && b && c
			return nil
		})
		return done
	}
	for !idle() {
		if time.Now().After(deadline) {
			e.dp.log.Warn("the copy-engine transport's streams still wait for the peer: releasing them", "rank", e.dp.c.Rank())
			e.ce.Release()
			break
		}
		time.Sleep(time.Millisecond)
	}
	ctx, cancel := context.WithTimeout(context.Background(), pairCloseWait)
	defer cancel()
	if err := e.nc.Barrier(ctx); err != nil {
		e.dp.log.Debug("no barrier with the peer before freeing the inbox", "err", err)
	}
	_ = e.nc.Do(func() error {
		_ = e.copyStream.Synchronize()
		_ = e.sumStream.Synchronize()
		_ = e.upd.Synchronize()
		return e.ce.Close()
	})
	e.pair, e.node, e.ce = nil, nil, nil
}

// boundRunAhead waits, polling, until the previous step's mark (finish
// records one per step) has passed: the host stays at most one step ahead
// of the GPU. Without a bound a program enqueues until CUDA's launch queue
// is full and then blocks inside a kernel launch, holding the context; if
// the peer dies then, Release (a CUDA call on another thread) blocks behind
// it and the streams waiting for the peer's flags are never let go.
// Polling here instead keeps the host out of CUDA and lets ctx end the
// wait. One step of look-ahead keeps the GPU fed: a step is milliseconds of
// GPU work and microseconds of launches.
func (e *deviceEngine) boundRunAhead(ctx context.Context) error {
	if e.steps < 2 {
		return nil
	}
	prev := e.stepEv[(e.steps-2)%len(e.stepEv)]
	for i := 0; ; i++ {
		var done bool
		err := e.nc.Do(func() error {
			var err error
			done, err = prev.Done()
			return err
		})
		if err != nil || done {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if i >= 100 {
			time.Sleep(20 * time.Microsecond)
		}
	}
}
