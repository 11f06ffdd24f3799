package coordinator

import (
	"sync"
	"time"
)

// background is the server's work that no call waits for: timers armed by
// applying an entry (a machine deadline, a new leader's grace), probes of
// agents whose stream ended, voter changes. Serve starts it and closes it
// once the calls ended: pending timers are stopped, and it returns once
// what is running returned. Work asked for before Serve (a replica applies
// its log, and may lead, before it serves) waits for start, so that a
// Server that never serves starts no goroutine; work asked for after close
// is dropped: the job is over here.
type background struct {
	mu      sync.Mutex
	started bool
	closed  bool
	pending []pendingWork // asked for before start
	timers  map[*time.Timer]struct{}
	wg      sync.WaitGroup
}

// pendingWork is f, due at due (zero: at once), waiting for start.
type pendingWork struct {
	due time.Time
	f   func()
}

// do runs f on a goroutine of its own, unless closed.
func (b *background) do(f func()) {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch {
	case b.closed:
	case !b.started:
		b.pending = append(b.pending, pendingWork{f: f})
	default:
		b.wg.Go(f)
	}
}

// after runs f on a goroutine of its own after d, unless closed first.
func (b *background) after(d time.Duration, f func()) {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch {
	case b.closed:
	case !b.started:
		b.pending = append(b.pending, pendingWork{due: time.Now().Add(d), f: f})
	default:
		b.arm(d, f)
	}
}

// arm runs f after d. b.mu is held.
func (b *background) arm(d time.Duration, f func()) {
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

// start runs what was asked for before it, each at its time, and what
// comes after at once.
func (b *background) start() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.started || b.closed {
		return
	}
	b.started = true
	for _, w := range b.pending {
		if w.due.IsZero() {
			b.wg.Go(w.f)
		} else {
			b.arm(max(time.Until(w.due), 0), w.f)
		}
	}
	b.pending = nil
}

// close stops the pending timers and waits for the functions running.
// Call it without holding a lock those functions take.
func (b *background) close() {
	b.mu.Lock()
	b.closed = true
	b.pending = nil
	for t := range b.timers {
		if t.Stop() {
			b.wg.Done() // its function will not run
		}
	}
	b.timers = nil
	b.mu.Unlock()
	b.wg.Wait()
}
