// Package osthread runs functions, one at a time, on one goroutine locked to
// its OS thread: the place for state that belongs to an OS thread, such as
// CUDA's current context and NCCL's groups. worker/ncclcomm and
// worker/cudago each keep one Executor per communicator or device.
//
// Start runs setup on the new thread; Do runs a function there and returns
// its error; Stop runs teardown there and ends the thread:
//
//	e, err := osthread.Start(setup, teardown)
//	if err != nil {
//		return err
//	}
//	defer e.Stop()
//	err = e.Do(func() error { return work() })
//
// A call costs a few hundred nanoseconds while both sides poll (see
// BenchmarkExecutor), and a futex wake-up after a pause.
package osthread

import (
	"errors"
	"fmt"
	"runtime"
	"runtime/debug"
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

// ErrStopped is returned by Do after Stop.
var ErrStopped = errors.New("osthread: the thread has stopped")

// request is one function for the executor's thread and its outcome.
type request struct {
	fn       func() error
	err      error
	panicked *panicked   // fn panicked; set with err, before done
	done     atomic.Bool // fn has returned and err is set
	waiting  atomic.Bool // the caller stopped polling and waits on wake
	wake     chan struct{}
}

// panicked carries a panic of fn from the executor's thread to the caller.
type panicked struct {
	value any
	stack []byte // the executor thread's stack at the panic
}

// Executor runs functions on one goroutine locked to its OS thread, one at
// a time. Its methods are safe for concurrent use.
//
// Requests are handed over through an atomic slot, not a channel, so that a
// call while the thread is polling costs a few hundred nanoseconds: the
// thread polls the slot for spinFor after each request, then sleeps on a
// channel; the caller polls its request's done flag for spinFor, then sleeps.
// Each side checks the other's "sleeping" flag after publishing (sequentially
// consistent atomics), so a wake-up is never lost.
type Executor struct {
	mu       sync.Mutex // one request at a time
	pending  atomic.Pointer[request]
	sleeping atomic.Bool
	wake     chan struct{} // cap 1
	stopped  atomic.Bool
	exited   chan struct{}
	req      request // reused by Do; guarded by mu
}

// Start starts the thread. setup runs on it first; when setup fails the
// thread exits and Start returns its error. teardown, if not nil, runs on
// the thread when it stops.
func Start(setup func() error, teardown func()) (*Executor, error) {
	e := &Executor{wake: make(chan struct{}, 1), exited: make(chan struct{})}
	e.req.wake = make(chan struct{}, 1)
	ready := make(chan error, 1)
	go e.loop(setup, teardown, ready)
	if err := <-ready; err != nil {
		<-e.exited
		return nil, err
	}
	return e, nil
}

func (e *Executor) loop(setup func() error, teardown func(), ready chan<- error) {
	runtime.LockOSThread()
	// The thread stays locked and exits with the goroutine: whatever CUDA
	// state is left on it dies with it instead of leaking into other goroutines.
	defer close(e.exited)
	if err := setup(); err != nil {
		ready <- err
		return
	}
	ready <- nil
	for e.serve(teardown) {
	}
}

// serve runs requests until the executor stops (false) or a request's fn
// panics (true: the panic went to its caller and the thread serves on). The
// panic is caught here, once per serve, so that the loop below pays nothing
// for it per request.
func (e *Executor) serve(teardown func()) (again bool) {
	defer func() {
		// Only a panic of fn is caught: the request is taken (fn is set
		// until its caller sees done) and not done. Any other panic, such
		// as one in teardown, goes on and ends the process.
		r := &e.req
		if r.fn == nil || r.done.Load() {
			return
		}
		v := recover()
		if v == nil {
			return
		}
		r.err = nil
		r.panicked = &panicked{value: v, stack: debug.Stack()}
		r.done.Store(true)
		if r.waiting.Load() {
			r.wake <- struct{}{}
		}
		again = true
	}()
	for {
		r := e.next()
		if r == nil {
			if teardown != nil {
				teardown()
			}
			return false
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
func (e *Executor) next() *request {
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

// Do runs fn on the executor's thread and returns its error, or ErrStopped
// after Stop. A panic in fn is raised again in the caller, with the thread's
// stack in its value; the thread serves on. fn must not call Do or Stop (it
// would wait for itself).
func (e *Executor) Do(fn func() error) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.stopped.Load() {
		return ErrStopped
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
	if p := r.panicked; p != nil {
		r.panicked = nil
		panic(fmt.Sprintf("osthread: panic on the locked thread: %v\n\n%s", p.value, p.stack))
	}
	return r.err
}

func (e *Executor) signal() {
	select {
	case e.wake <- struct{}{}:
	default:
	}
}

// Stop ends the thread after the request in progress (running teardown on
// it) and waits for it. Later calls to Do return ErrStopped. Stop may be
// called more than once.
func (e *Executor) Stop() {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.stopped.Swap(true) {
		return
	}
	e.signal()
	<-e.exited
}
