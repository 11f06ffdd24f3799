// Package kv is the coordinator's key-value store for rendezvous data such as
// NCCL unique ids: every key is written once, and readers can wait for a key
// that is not there yet (long poll).
package kv

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
)

// ErrConflict means the key holds another value already.
var ErrConflict = errors.New("kv: key holds another value")

// Store is a write-once key-value store. It is safe for concurrent use; the
// zero value is not, use New.
type Store struct {
	mu    sync.Mutex
	vals  map[string][]byte
	ready map[string]chan struct{} // closed once the key has a value
}

// New returns an empty store.
func New() *Store {
	return &Store{vals: map[string][]byte{}, ready: map[string]chan struct{}{}}
}

// Put stores value under key. Putting the same value again is fine; another
// value returns ErrConflict.
func (s *Store) Put(key string, value []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if old, ok := s.vals[key]; ok {
		if bytes.Equal(old, value) {
			return nil
		}
		return fmt.Errorf("%w: key %q: keys are written once; put each generation's value under its own key", ErrConflict, key)
	}
	s.vals[key] = slices.Clone(value)
	if s.vals[key] == nil {
		s.vals[key] = []byte{}
	}
	if ch, ok := s.ready[key]; ok {
		close(ch)
	} else {
		s.ready[key] = closedChan
	}
	return nil
}

var closedChan = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// Get returns the value of key, if it has one. The caller owns the result.
func (s *Store) Get(key string) ([]byte, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	v, ok := s.vals[key]
	return slices.Clone(v), ok
}

// Ready returns a channel that is closed once key has a value; it is closed
// already if it has one.
func (s *Store) Ready(key string) <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	ch, ok := s.ready[key]
	if !ok {
		ch = make(chan struct{})
		s.ready[key] = ch
	}
	return ch
}

// Wait returns the value of key once it has one, or ctx's error if ctx ends
// first.
func (s *Store) Wait(ctx context.Context, key string) ([]byte, error) {
	select {
	case <-s.Ready(key):
		v, _ := s.Get(key)
		return v, nil
	case <-ctx.Done():
		return nil, fmt.Errorf("kv: wait for key %q: %w", key, context.Cause(ctx))
	}
}
