// Package commtest holds fakes for testing code that uses package comm: an
// in-memory Store, so that tests can run several ranks of a backend as
// goroutines of one process.
package commtest

import (
	"bytes"
	"context"
	"fmt"
	"sync"

	"github.com/gotrain/gotrain/worker/comm"
)

// MemStore is an in-memory comm.Store. Get blocks until the key is Put or the
// context is done. It is safe for concurrent use.
type MemStore struct {
	mu      sync.Mutex
	values  map[string][]byte
	waiters map[string]chan struct{} // closed when the key is Put
}

var _ comm.Store = (*MemStore)(nil)

// NewMemStore returns an empty store.
func NewMemStore() *MemStore {
	return &MemStore{values: map[string][]byte{}, waiters: map[string]chan struct{}{}}
}

// Put stores a copy of value under key. Putting the same value again is a
// no-op; putting a different one fails.
func (s *MemStore) Put(ctx context.Context, key string, value []byte) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if old, ok := s.values[key]; ok {
		if bytes.Equal(old, value) {
			return nil
		}
		return fmt.Errorf("commtest: key %q already holds a different value", key)
	}
	s.values[key] = bytes.Clone(value)
	if w, ok := s.waiters[key]; ok {
		close(w)
		delete(s.waiters, key)
	}
	return nil
}

// Get returns a copy of the value under key, waiting until it is Put or ctx
// is done.
func (s *MemStore) Get(ctx context.Context, key string) ([]byte, error) {
	s.mu.Lock()
	if v, ok := s.values[key]; ok {
		s.mu.Unlock()
		return bytes.Clone(v), nil
	}
	w, ok := s.waiters[key]
	if !ok {
		w = make(chan struct{})
		s.waiters[key] = w
	}
	s.mu.Unlock()
	select {
	case <-w:
	case <-ctx.Done():
		return nil, fmt.Errorf("commtest: wait for key %q: %w", key, ctx.Err())
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return bytes.Clone(s.values[key]), nil
}

// Keys returns the number of keys stored, for tests that check what was published.
func (s *MemStore) Keys() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.values)
}
