package ncclcomm

import (
	"errors"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// spinFor is how long the executor polls for the next request after one
// finishes, and how long a caller polls for its request to finish, before
// either blocks in the scheduler. Waking a goroutine locked to an OS thread
// costs a futex round trip (measured: 26 µs for a channel round trip to a
// locked goroutine on a 2-core VM, against 0.4 µs with polling), far more than
// a small NCCL collective; polling for a few tens of microseconds keeps
// back-to-back calls on the fast path and costs little when calls are rare.
const spinFor = 500 * time.Microsecond

// errExecutorStopped is returned by do after stop.
var errExecutorStopped = errors.New("ncclcomm: the communicator's thread has stopped")

// request is one function for the executor's thread and its outcome.
type request struct {
	fn      func() error
	err     error
	done    atomic.Bool // fn has returned and err is set
	waiting atomic.Bool // the caller stopped polling and waits on wake
	wake    chan struct{}
}

// executor runs functions on one goroutine locked to its OS thread, one at a
// time: CUDA's current context and NCCL's groups belong to an OS thread, so
// every CUDA and NCCL call of a communicator goes through its executor.
//
// Requests are handed over through an atomic slot, not a channel, so that a
// call while the thread is polling costs a few hundred nanoseconds: the
// thread polls the slot for spinFor after each request, then sleeps on a
// channel; the caller polls its request's done flag for spinFor, then sleeps.
// Each side checks the other's "sleeping" flag after publishing (sequentially
// consistent atomics), so a wake-up is never lost.
type executor struct {
	mu       sync.Mutex // one request at a time
	pending  atomic.Pointer[request]
	sleeping atomic.Bool
	wake     chan struct{} // cap 1
	stopped  atomic.Bool
	exited   chan struct{}
	req      request // reused by do; guarded by mu
}

// newExecutor starts the thread. setup runs on it first; when setup fails the
// thread exits and newExecutor returns its error. teardown runs on the thread
// when it stops.
func newExecutor(setup func() error, teardown func()) (*executor, error) {
	e := &executor{wake: make(chan struct{}, 1), exited: make(chan struct{})}
	e.req.wake = make(chan struct{}, 1)
	ready := make(chan error, 1)
	go e.loop(setup, teardown, ready)
	if err := <-ready; err != nil {
		<-e.exited
		return nil, err
	}
	return e, nil
}

func (e *executor) loop(setup func() error, teardown func(), ready chan<- error) {
	runtime.LockOSThread()
	// The thread stays locked and exits with the goroutine: whatever CUDA
	// state is left on it dies with it instead of leaking into other goroutines.
	defer close(e.exited)
	if err := setup(); err != nil {
		ready <- err
		return
	}
	ready <- nil
	for {
		r := e.next()
		if r == nil {
			if teardown != nil {
				teardown()
			}
			return
		}
		r.err = r.fn()
		r.done.Store(true)
		if r.waiting.Load() {
			r.wake <- struct{}{}
		}
	}
}

// next returns the next request, polling for spinFor and then sleeping; nil
// once the executor is stopped.
func (e *executor) next() *request {
	for {
		if r := e.pending.Swap(nil); r != nil {
			return r
		}
		if e.stopped.Load() {
			return nil
		}
		// Poll with loads: a swap in the loop would fight the caller for the
		// cache line.
		if spinUntil(e.pending.Load) != nil {
			continue
		}
		e.sleeping.Store(true)
		if r := e.pending.Swap(nil); r != nil {
			e.sleeping.Store(false)
			return r
		}
		if !e.stopped.Load() {
			<-e.wake
		}
		e.sleeping.Store(false)
	}
}

// spinUntil polls f for spinFor and returns its first non-nil answer, or nil.
func spinUntil[T any](f func() *T) *T {
	deadline := time.Now().Add(spinFor)
	for i := 1; ; i++ {
		if v := f(); v != nil {
			return v
		}
		if i%128 == 0 && time.Now().After(deadline) {
			return nil
		}
	}
}

var doneMark = new(struct{})

// do runs fn on the executor's thread and returns its error.
func (e *executor) do(fn func() error) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.stopped.Load() {
		return errExecutorStopped
	}
	r := &e.req
	r.fn = fn
	r.err = nil
	r.done.Store(false)
	r.waiting.Store(false)
	select {
	case <-r.wake: // a late wake-up from the previous request
	default:
	}
	e.pending.Store(r)
	if e.sleeping.Load() {
		e.signal()
	}
	if spinUntil(func() *struct{} {
		if r.done.Load() {
			return doneMark
		}
		return nil
	}) == nil {
		r.waiting.Store(true)
		if !r.done.Load() {
			<-r.wake
		}
	}
	r.fn = nil
	return r.err
}

func (e *executor) signal() {
	select {
	case e.wake <- struct{}{}:
	default:
	}
}

// stop ends the thread after the request in progress (running teardown on
// it) and waits for it. Later calls to do fail.
func (e *executor) stop() {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.stopped.Swap(true) {
		return
	}
	e.signal()
	<-e.exited
}
