package cudago

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
)

// ErrClosed is returned by calls on a closed Device.
var ErrClosed = errors.New("cudago: the device is closed")

// executor runs functions one at a time on one goroutine locked to its OS
// thread: a CUDA context is current per OS thread, and goroutines move
// between threads, so every call that needs the device's context goes
// through the executor.
//
// A call is a channel round trip to the locked goroutine (a few tens of
// microseconds when the thread sleeps): put many CUDA calls in one Do rather
// than one Do per call. worker/ncclcomm's executor polls instead, for the
// latency of small collectives; a training step here makes few calls.
type executor struct {
	work     chan func()
	quit     chan struct{}
	exited   chan struct{}
	stopOnce sync.Once
}

// newExecutor starts the thread and runs setup on it first; when setup fails
// the thread exits and newExecutor returns its error. teardown runs on the
// thread when the executor stops.
func newExecutor(setup func() error, teardown func()) (*executor, error) {
	e := &executor{work: make(chan func()), quit: make(chan struct{}), exited: make(chan struct{})}
	ready := make(chan error, 1)
	go e.loop(setup, teardown, ready)
	if err := <-ready; err != nil {
		<-e.exited
		return nil, err
	}
	return e, nil
}

func (e *executor) loop(setup func() error, teardown func(), ready chan<- error) {
	// Never unlocked: the thread exits with the goroutine, and whatever CUDA
	// state is left on it goes with it instead of leaking into other
	// goroutines.
	runtime.LockOSThread()
	defer close(e.exited)
	if err := setup(); err != nil {
		ready <- err
		return
	}
	ready <- nil
	for {
		select {
		case fn := <-e.work:
			fn()
		case <-e.quit:
			if teardown != nil {
				teardown()
			}
			return
		}
	}
}

// panicked carries a panic of fn from the executor's thread to the caller.
type panicked struct{ value any }

// do runs fn on the executor's thread and returns its error. A panic in fn
// is raised again in the caller. fn must not call do (it would wait for
// itself).
func (e *executor) do(fn func() error) error {
	type outcome struct {
		err error
		p   *panicked
	}
	done := make(chan outcome, 1)
	run := func() {
		var o outcome
		defer func() {
			if v := recover(); v != nil {
				o.p = &panicked{v}
			}
			done <- o
		}()
		o.err = fn()
	}
	select {
	case e.work <- run:
	case <-e.quit:
		return ErrClosed
	}
	o := <-done
	if o.p != nil {
		panic(fmt.Sprintf("cudago: panic on the device thread: %v", o.p.value))
	}
	return o.err
}

// stop ends the thread after the call in progress, running teardown on it,
// and waits for it. Later calls of do return ErrClosed.
func (e *executor) stop() {
	e.stopOnce.Do(func() { close(e.quit) })
	<-e.exited
}
