package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	gotrainv1 "github.com/gotrain/gotrain/proto/gotrain/v1"
	"github.com/gotrain/gotrain/worker/comm"
)

// In-process recovery. A worker that trains inside Run tells its agent it is
// recoverable. When a generation ends (another rank died), the agent does not
// stop it: it sends a GenerationChange{ended} over the control stream, and
// Run aborts the generation's communicator (so that no collective can hang)
// and waits. When the next generation starts, the agent hands it over
// (GenerationChange{started}) instead of starting a new process; only the
// ranks whose processes are gone are started again. Run builds the new
// generation's communicator and calls train again, with Generation.Source
// naming a rank that survived, from which the new processes restore the
// state by broadcast (Generation.Restore).

// ErrGenerationEnded is the cause of the context Run gives train when the
// agent says the generation ended.
var ErrGenerationEnded = errors.New("worker: the generation ended")

// recoverWait is how long Run waits, after train failed, for the agent to say
// that the generation ended. A failure the agent never hears of (a bug in
// this rank) ends Run with train's error after it.
const recoverWait = 10 * time.Second

// Generation is one generation of the job as Run's train function sees it.
type Generation struct {
	Number       int64
	RestartCount int
	Rank         int
	WorldSize    int
	// Comm is the generation's communicator; Run closes (or aborts) it.
	Comm Comm
	// Survivor: this process ran an earlier generation and kept its state.
	Survivor bool
	// Source is the lowest rank that survived from the previous generation,
	// the one to restore state from; -1 when there is none (the job's first
	// generation, or every process is new: restore from a checkpoint then).
	Source int
	// Recovery says when this process went through the steps of the
	// recovery that led to this generation (zero times for steps it did not
	// take: a new process only has CommReady), for start-up breakdowns.
	Recovery RecoveryTimes
}

// RecoveryTimes are the wall-clock times of one in-process recovery.
type RecoveryTimes struct {
	Ended     time.Time // the agent said the previous generation ended
	Aborted   time.Time // the previous generation's communicator was handed to abortInBackground
	Started   time.Time // the agent handed this generation over
	CommReady time.Time // this generation's communicator was built
}

// Restore broadcasts bufs from Source to every rank, so that new processes
// take the survivors' state. Every rank must call it with buffers of the same
// shapes. It does nothing when Source is -1.
func (g *Generation) Restore(ctx context.Context, bufs ...Buffer) error {
	if g.Source < 0 {
		return nil
	}
	for _, b := range bufs {
		if err := g.Comm.Broadcast(ctx, b, g.Source); err != nil {
			return fmt.Errorf("worker: restore state from rank %d: %w", g.Source, err)
		}
	}
	return nil
}

// Run calls train with a communicator named name over every rank, and
// recovers in process when another rank fails: train's context is canceled
// with cause ErrGenerationEnded, the communicator is aborted, and once the
// next generation starts train is called again with its communicator. Run
// returns nil when train returns nil, and train's error when train fails
// and the job does not go on (the agent never ended the generation, or ctx
// ended).
//
// train must be able to start over: keep the training state outside it and
// call g.Restore first thing, so that restarted ranks receive the
// survivors' state.
func (w *Worker) Run(ctx context.Context, name string, train func(ctx context.Context, g *Generation) error) error {
	w.recov.enable()
	if w.diag != nil {
		w.diag.reply(&gotrainv1.WorkerMessage{Msg: &gotrainv1.WorkerMessage_Hello{Hello: &gotrainv1.WorkerHello{
			Rank: int32(w.Rank), Pid: int32(os.Getpid()), Generation: w.Generation, Recoverable: true,
		}}})
	}
	survivor := false
	for {
		err := w.runGeneration(ctx, name, survivor, train)
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return err
		}
		next, werr := w.awaitNext(ctx, w.Generation)
		if werr != nil {
			w.logger.Debug("no recovery", "err", werr)
			return err
		}
		w.logger.Info("recovering in process", "from_generation", w.Generation, "to_generation", next.GetGeneration(), "err", err)
		w.recovered.Ended, w.recovered.Started = w.recov.times()
		if aerr := w.adoptGeneration(next, os.Setenv, os.Unsetenv); aerr != nil { // identity.go
			return errors.Join(err, aerr)
		}
		survivor = true
	}
}

func (w *Worker) runGeneration(ctx context.Context, name string, survivor bool, train func(context.Context, *Generation) error) error {
	gctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	go w.watchEnd(gctx, w.Generation, cancel)

	c, err := w.NewComm(gctx, name)
	if err != nil {
		return err
	}
	rt := w.recovered
	if !survivor {
		rt = RecoveryTimes{}
	}
	rt.CommReady = time.Now()
	stop := context.AfterFunc(gctx, func() { _ = comm.Abort(c) })
	defer stop()

	// The lowest surviving rank is the source of the state.
	v := []int64{int64(w.WorldSize)}
	if survivor {
		v[0] = int64(w.Rank)
	}
	if err := c.AllReduce(gctx, comm.Host(v), comm.Host(v), comm.Min); err != nil {
		abort(c)
		return fmt.Errorf("worker: rank %d: find the surviving ranks: %w", w.Rank, err)
	}
	g := &Generation{
		Number: w.Generation, RestartCount: w.RestartCount, Rank: w.Rank, WorldSize: w.WorldSize,
		Comm: c, Survivor: survivor, Source: int(v[0]), Recovery: rt,
	}
	if g.Source == w.WorldSize {
		g.Source = -1
	}
	if err := train(gctx, g); err != nil {
		abortInBackground(c, w.logger)
		w.recovered = RecoveryTimes{Aborted: time.Now()}
		if cause := context.Cause(gctx); errors.Is(cause, ErrGenerationEnded) {
			return fmt.Errorf("%w: %w", cause, err)
		}
		return err
	}
	return c.Close()
}

// abort tears c down without waiting for peers, then releases what it holds
// (the NCCL backend's thread and device memory).
func abort(c Comm) {
	_ = comm.Abort(c)
	_ = c.Close()
}

// abortInBackground aborts c on a goroutine of its own, so that the next
// generation's communicator is built meanwhile. ncclCommAbort raises the
// communicator's abort flag first, which ends its kernels still waiting for
// a dead peer at once, and then joins NCCL's threads, which now and then
// takes half a second (a proxy thread sleeping in poll; seen on 2 × H200
// in 2 of ~12 recoveries): nothing of the next generation waits for that.
// Communicators are independent in NCCL, so the new one's init is not
// affected by the old one's teardown.
func abortInBackground(c Comm, log *slog.Logger) {
	go func() {
		start := time.Now()
		abort(c)
		log.Debug("previous communicator aborted", "took", time.Since(start))
	}()
}

// watchEnd cancels ctx with ErrGenerationEnded once the agent says
// generation gen ended.
func (w *Worker) watchEnd(ctx context.Context, gen int64, cancel context.CancelCauseFunc) {
	for {
		ended, _, changed := w.recov.state()
		if ended >= gen {
			cancel(ErrGenerationEnded)
			return
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return
		}
	}
}

// awaitNext waits for the generation after gen. It gives up when the agent
// has not said within recoverWait that gen ended, or the control stream ends.
func (w *Worker) awaitNext(ctx context.Context, gen int64) (*gotrainv1.GenerationStarted, error) {
	deadline := time.NewTimer(recoverWait)
	defer deadline.Stop()
	var gone <-chan struct{}
	if w.diag != nil {
		gone = w.diag.recvd
	}
	for {
		ended, started, changed := w.recov.state()
		if started != nil && started.GetGeneration() > gen {
			return started, nil
		}
		timeout := deadline.C
		if ended >= gen {
			timeout = nil // it ended; the next one comes, or the agent stops this process
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-timeout:
			return nil, fmt.Errorf("worker: rank %d: the agent did not end generation %d within %s", w.Rank, gen, recoverWait)
		case <-gone:
			return nil, fmt.Errorf("worker: rank %d: the agent's control stream ended", w.Rank)
		}
	}
}

// recovery is what the agent said about generation changes.
type recovery struct {
	mu      sync.Mutex
	on      bool
	ended   int64                        // newest generation that ended; -1 for none
	started *gotrainv1.GenerationStarted // newest generation handed over; nil for none
	changed chan struct{}                // closed and replaced on every change
	// When ended and started last changed.
	endedAt, startedAt time.Time
}

func (r *recovery) times() (ended, started time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.endedAt, r.startedAt
}

func (r *recovery) initLocked() {
	if r.changed == nil {
		r.changed, r.ended = make(chan struct{}), -1
	}
}

func (r *recovery) enable() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.initLocked()
	r.on = true
}

func (r *recovery) enabled() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.on
}

func (r *recovery) state() (ended int64, started *gotrainv1.GenerationStarted, changed <-chan struct{}) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.initLocked()
	return r.ended, r.started, r.changed
}

// generationChanged takes a GenerationChange from the agent (attach.go's
// receiver calls it).
func (w *Worker) generationChanged(gc *gotrainv1.GenerationChange) {
	r := &w.recov
	r.mu.Lock()
	defer r.mu.Unlock()
	r.initLocked()
	if e := gc.GetEnded(); e != nil && e.GetGeneration() > r.ended {
		r.ended, r.endedAt = e.GetGeneration(), time.Now()
	}
	if s := gc.GetStarted(); s != nil && (r.started == nil || s.GetGeneration() > r.started.GetGeneration()) {
		r.started, r.startedAt = s, time.Now()
	}
	close(r.changed)
	r.changed = make(chan struct{})
}
