package coordinator

import (
	"sync"
	"time"
)

// background is the server's work that no call waits for: timers armed by
// applying an entry (a machine deadline, a new leader's grace), probes of
// agents whose stream ended, voter changes. Serve closes it once the calls
// ended: pending timers are stopped, and it returns once what is running
// returned. Work started after that is dropped: the job is over here.
type background struct {
	mu     sync.Mutex
	closed bool
	timers map[*time.Timer]struct{}
	wg     sync.WaitGroup
}

// do runs f on a goroutine of its own, unless closed.
func (b *background) do(f func()) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return
	}
	b.wg.Go(f)
}

// after runs f on a goroutine of its own after d, unless closed first.
func (b *background) after(d time.Duration, f func()) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return
	}
	if b.timers == nil {
		b.timers = map[*time.Timer]struct{}{}
	}
	b.wg.Add(1)
	var t *time.Timer
	// t is set before the function can read it: it takes b.mu first.
	t = time.AfterFunc(d, func() {
		defer b.wg.Done()
		b.mu.Lock()
		delete(b.timers, t)
		b.mu.Unlock()
		f()
	})
	b.timers[t] = struct{}{}
}

// close stops the pending timers and waits for the functions running.
// Call it without holding a lock those functions take.
func (b *background) close() {
	b.mu.Lock()
	b.closed = true
	for t := range b.timers {
		if t.Stop() {
			b.wg.Done() // its function will not run
		}
	}
	b.timers = nil
	b.mu.Unlock()
	b.wg.Wait()
}
