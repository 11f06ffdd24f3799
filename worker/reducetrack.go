package worker

import (
	"errors"
	"sync"
	"time"

	"github.com/gotrain/gotrain/worker/comm"
	"github.com/gotrain/gotrain/worker/flight"
)

// reduceTracker records DataParallel's device reductions in the
// communicator's flight recorder, which the hang detector reads: each
// bucket's reduction is entered when it is launched, and the reductions of
// a step complete when a mark recorded on the compute stream at the step's
// Finish has passed on the GPU, which a goroutine polls. Without it a job
// hung inside DataParallel on a GPU showed no collective at all (its work
// never goes through the wrapped communicator's calls), and `gotrain
// diagnose` could not name the rank that stopped reducing.
type reduceTracker struct {
	rec *flight.Recorder
	// do runs a function on the thread where the marks may be queried
	// (the communicator's).
	do    func(func() error) error
	jobs  chan trackJob
	stop  chan struct{}
	cur   []uint64 // seqs launched in this step
	carry []uint64 // seqs of steps whose job did not fit the queue
	wg    sync.WaitGroup
}

// stepMark is a point on the compute stream (a CUDA event).
type stepMark interface {
	Done() (bool, error)
}

type trackJob struct {
	mark stepMark
	seqs []uint64
}

// trackerPoll bounds the pause between two polls of a mark.
const trackerPoll = 2 * time.Millisecond

// newReduceTracker starts tracking; steps is how many steps may wait for
// the poller before their seqs ride on a later step's mark.
func newReduceTracker(rec *flight.Recorder, do func(func() error) error, steps int) *reduceTracker {
	t := &reduceTracker{rec: rec, do: do, jobs: make(chan trackJob, steps), stop: make(chan struct{})}
	t.wg.Add(1)
	go t.loop()
	return t
}

// launched records bucket reduction of count float32 as entered.
func (t *reduceTracker) launched(count int, stream uintptr) {
	t.cur = append(t.cur, t.rec.Enqueue(flight.OpAllReduce, comm.Float32, comm.Avg, int64(count), -1, stream, false))
}

// stepEnd hands the poller the seqs launched since the last call, to
// complete when m (recorded after them) has passed.
func (t *reduceTracker) stepEnd(m stepMark) {
	if len(t.cur) == 0 {
		return
	}
	seqs := append(t.carry, t.cur...)
	t.cur, t.carry = nil, nil
	select {
	case t.jobs <- trackJob{m, seqs}:
	default: // the poller is behind: a later mark covers these
		t.carry = seqs
	}
}

func (t *reduceTracker) loop() {
	defer t.wg.Done()
	for {
		select {
		case <-t.stop:
			return
		case j := <-t.jobs:
			if !t.await(j) {
				return
			}
		}
	}
}

// await polls j's mark until it has passed, then completes j's seqs. It
// reports false when told to stop, or when the communicator is closed
// (the seqs stay as they are: the process is shutting down).
func (t *reduceTracker) await(j trackJob) bool {
	for pause := 50 * time.Microsecond; ; pause = min(2*pause, trackerPoll) {
		var done bool
		err := t.do(func() error {
			var err error
			done, err = j.mark.Done()
			return err
		})
		switch {
		case errors.Is(err, comm.ErrClosed):
			return false
		case err != nil:
			for _, s := range j.seqs {
				t.rec.Fail(s, err)
			}
			return true
		case done:
			for _, s := range j.seqs {
				t.rec.Complete(s)
			}
			return true
		}
		select {
		case <-t.stop:
			return false
		case <-time.After(pause):
		}
	}
}

// close stops the poller; steps not seen to pass stay pending in the
// recorder.
func (t *reduceTracker) close() {
	close(t.stop)
	t.wg.Wait()
}
