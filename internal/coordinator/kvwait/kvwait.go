// Package kvwait holds the coordinator's readers that wait for a key of its
// key-value store to get a value (long poll). The store itself is data in
// the replicated state (package kv); this is the server's side: channels
// and a lock.
//
// A reader holds an entry only while it waits: Watch's release removes it,
// so lookups of keys that never come leave nothing behind. The caller
// makes "the key has no value, so watch it" and "the key got a value, so
// Put" atomic (the server holds its lock around both), so no wake-up is
// lost.
package kvwait

import "sync"

// Waits are the readers waiting for keys. Safe for concurrent use; the zero
// value is not ready, use New.
type Waits struct {
	mu      sync.Mutex
	waiting map[string]*waiting
}

// waiting is a missing key's readers: ch is closed by Put; n counts the
// Watch calls not yet released.
type waiting struct {
	ch chan struct{}
	n  int
}

// New returns Waits with no reader.
func New() *Waits { return &Waits{waiting: map[string]*waiting{}} }

// Watch returns a channel that Put(key) closes, and release, which the
// caller calls once it no longer waits (idempotent): the last release of a
// key forgets it.
func (w *Waits) Watch(key string) (ready <-chan struct{}, release func()) {
	w.mu.Lock()
	defer w.mu.Unlock()
	e := w.waiting[key]
	if e == nil {
		e = &waiting{ch: make(chan struct{})}
		w.waiting[key] = e
	}
	e.n++
	var once sync.Once
	return e.ch, func() {
		once.Do(func() {
			w.mu.Lock()
			defer w.mu.Unlock()
			if e.n--; e.n == 0 && w.waiting[key] == e {
				delete(w.waiting, key)
			}
		})
	}
}

// Put wakes the readers of key: it has a value now.
func (w *Waits) Put(key string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if e, ok := w.waiting[key]; ok {
		close(e.ch)
		delete(w.waiting, key)
	}
}

// PutAll wakes the readers of every key has says has a value (a state
// replaced by a snapshot).
func (w *Waits) PutAll(has func(key string) bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for key, e := range w.waiting {
		if has(key) {
			close(e.ch)
			delete(w.waiting, key)
		}
	}
}

// Len is how many keys readers wait for.
func (w *Waits) Len() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.waiting)
}
