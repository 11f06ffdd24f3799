// Package kv is the coordinator's key-value store for rendezvous data such as
// NCCL unique ids: every key is written once, and readers can wait for a key
// that is not there yet (long poll).
//
// The store is bounded (Limits): the size of a key and of a value, and the
// keys and bytes of the whole store (one store per job). A reader waiting for
// a missing key holds an entry only while it waits: Watch's release removes
// it, so lookups of keys that never come leave nothing behind.
package kv

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
)

// Errors of the package.
var (
	// ErrConflict means the key holds another value already.
	ErrConflict = errors.New("kv: key holds another value")
	// ErrTooLarge means a key or value is over its Limits.
	ErrTooLarge = errors.New("kv: too large")
	// ErrFull means the store holds as many keys or bytes as its Limits allow.
	ErrFull = errors.New("kv: store is full")
)

// Limits bound a store.
type Limits struct {
	// MaxKeyBytes bounds a key's length.
	MaxKeyBytes int
	// MaxValueBytes bounds a value's length.
	MaxValueBytes int
	// MaxKeys bounds how many keys the store holds.
	MaxKeys int
	// MaxBytes bounds the bytes the store holds: keys, values and
	// EntryOverhead per key.
	MaxBytes int64
}

// EntryOverhead is what each key costs beyond its key and value bytes (map
// entry, slice header, channel), counted against Limits.MaxBytes.
const EntryOverhead = 128

// DefaultLimits are a job's: ample for rendezvous (an address or an NCCL id
// per rank, communicator and generation: 65 536 ranks over several restarts
// hold a few tens of MiB), small enough that a token holder cannot run the
// coordinator out of memory.
func DefaultLimits() Limits {
	return Limits{MaxKeyBytes: 1 << 10, MaxValueBytes: 1 << 20, MaxKeys: 1 << 20, MaxBytes: 256 << 20}
}

// Store is a write-once key-value store. It is safe for concurrent use; the
// zero value is not, use New.
type Store struct {
	lim Limits

	mu      sync.Mutex
	vals    map[string][]byte
	bytes   int64
	waiting map[string]*waiting // keys without a value that someone waits for
}

// waiting is a missing key's readers: ch is closed by Put; n counts the
// Watch calls not yet released.
type waiting struct {
	ch chan struct{}
	n  int
}

// New returns an empty store with DefaultLimits.
func New() *Store { return NewWithLimits(DefaultLimits()) }

// NewWithLimits returns an empty store bounded by lim.
func NewWithLimits(lim Limits) *Store {
	return &Store{lim: lim, vals: map[string][]byte{}, waiting: map[string]*waiting{}}
}

// CheckKey says whether key is within the store's limits (ErrTooLarge if
// not).
func (s *Store) CheckKey(key string) error {
	if len(key) > s.lim.MaxKeyBytes {
		return fmt.Errorf("%w: key of %d bytes, at most %d", ErrTooLarge, len(key), s.lim.MaxKeyBytes)
	}
	return nil
}

// Put stores value under key. Putting the same value again is fine; another
// value returns ErrConflict. A key or value over the limits returns
// ErrTooLarge, a store at its limits ErrFull.
func (s *Store) Put(key string, value []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if held, err := s.check(key, value); held || err != nil {
		return err
	}
	cost := int64(len(key) + len(value) + EntryOverhead)
	v := slices.Clone(value)
	if v == nil {
		v = []byte{}
	}
	s.vals[key] = v
	s.bytes += cost
	if w, ok := s.waiting[key]; ok {
		close(w.ch)
		delete(s.waiting, key)
	}
	return nil
}

// Check says what Put(key, value) would do now, changing nothing: held
// when the key holds this value already (Put is a no-op), or Put's error.
// A replicated coordinator's leader asks before it puts a value into the
// log, so that neither refused nor repeated puts reach it.
func (s *Store) Check(key string, value []byte) (held bool, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.check(key, value)
}

// check is Check with s.mu held.
func (s *Store) check(key string, value []byte) (held bool, err error) {
	if err := s.CheckKey(key); err != nil {
		return false, err
	}
	if len(value) > s.lim.MaxValueBytes {
		return false, fmt.Errorf("%w: value of %d bytes under key %q, at most %d", ErrTooLarge, len(value), key, s.lim.MaxValueBytes)
	}
	if old, ok := s.vals[key]; ok {
		if bytes.Equal(old, value) {
			return true, nil
		}
		return false, fmt.Errorf("%w: key %q: keys are written once; put each generation's value under its own key", ErrConflict, key)
	}
	cost := int64(len(key) + len(value) + EntryOverhead)
	if len(s.vals) >= s.lim.MaxKeys || s.bytes+cost > s.lim.MaxBytes {
		return false, fmt.Errorf("%w: it holds %d keys and %d bytes (at most %d keys, %d bytes); put rendezvous data only", ErrFull, len(s.vals), s.bytes, s.lim.MaxKeys, s.lim.MaxBytes)
	}
	return false, nil
}

// Reset empties the store (a coordinator replica restoring a snapshot);
// readers waiting for keys go on waiting.
func (s *Store) Reset() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.vals, s.bytes = map[string][]byte{}, 0
}

var closedChan = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// Get returns the value of key, if it has one. The caller owns the result.
func (s *Store) Get(key string) ([]byte, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	v, ok := s.vals[key]
	return slices.Clone(v), ok
}

// Watch returns a channel that is closed once key has a value (closed
// already if it has one), and release, which the caller calls once it no
// longer waits: the store forgets a missing key when its last reader
// released it.
func (s *Store) Watch(key string) (ready <-chan struct{}, release func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.vals[key]; ok {
		return closedChan, func() {}
	}
	w := s.waiting[key]
	if w == nil {
		w = &waiting{ch: make(chan struct{})}
		s.waiting[key] = w
	}
	w.n++
	var once sync.Once
	return w.ch, func() {
		once.Do(func() {
			s.mu.Lock()
			defer s.mu.Unlock()
			if w.n--; w.n == 0 && s.waiting[key] == w {
				delete(s.waiting, key)
			}
		})
	}
}

// Wait returns the value of key once it has one, or ctx's error if ctx ends
// first.
func (s *Store) Wait(ctx context.Context, key string) ([]byte, error) {
	ready, release := s.Watch(key)
	defer release()
	select {
	case <-ready:
		v, _ := s.Get(key)
		return v, nil
	case <-ctx.Done():
		return nil, fmt.Errorf("kv: wait for key %q: %w", key, context.Cause(ctx))
	}
}

// Stats is what a store holds.
type Stats struct {
	// Keys and Bytes: the keys with a value and what they cost against
	// Limits.MaxBytes.
	Keys  int
	Bytes int64
	// Waiting is the missing keys that readers wait for.
	Waiting int
}

// Stats returns what the store holds.
func (s *Store) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return Stats{Keys: len(s.vals), Bytes: s.bytes, Waiting: len(s.waiting)}
}

// Entries returns a copy of every key's value (a replica's state digest).
func (s *Store) Entries() map[string][]byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string][]byte, len(s.vals))
	for k, v := range s.vals {
		out[k] = slices.Clone(v)
	}
	return out
}
