// Package kv is the coordinator's key-value store for rendezvous data such as
// NCCL unique ids: every key is written once. The store is data, part of
// the coordinator's replicated state; readers that wait for a key that is
// not there yet wait in the server (package kvwait), not here.
//
// The store is bounded (Limits): the size of a key and of a value, and the
// keys and bytes of the whole store (one store per job).
package kv

import (
	"bytes"
	"errors"
	"fmt"
	"maps"
	"slices"
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
// entry, slice header), counted against Limits.MaxBytes.
const EntryOverhead = 128

// DefaultLimits are a job's: ample for rendezvous (an address or an NCCL id
// per rank, communicator and generation: 65 536 ranks over several restarts
// hold a few tens of MiB), small enough that a token holder cannot run the
// coordinator out of memory.
func DefaultLimits() Limits {
	return Limits{MaxKeyBytes: 1 << 10, MaxValueBytes: 1 << 20, MaxKeys: 1 << 20, MaxBytes: 256 << 20}
}

// Store is a write-once key-value store. It is not safe for concurrent
// use (the coordinator's state is guarded by its server); the zero value
// is not ready, use New.
type Store struct {
	lim   Limits
	vals  map[string][]byte
	bytes int64
}

// New returns an empty store with DefaultLimits.
func New() *Store { return NewWithLimits(DefaultLimits()) }

// NewWithLimits returns an empty store bounded by lim.
func NewWithLimits(lim Limits) *Store {
	return &Store{lim: lim, vals: map[string][]byte{}}
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
	return nil
}

// Check says what Put(key, value) would do now, changing nothing: held
// when the key holds this value already (Put is a no-op), or Put's error.
// A replicated coordinator's leader asks before it puts a value into the
// log, so that neither refused nor repeated puts reach it.
func (s *Store) Check(key string, value []byte) (held bool, err error) {
	return s.check(key, value)
}

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

// Prune drops the keys for which drop says so and returns how many it
// dropped: their bytes count no longer.
func (s *Store) Prune(drop func(key string) bool) int {
	n := 0
	for _, k := range slices.Sorted(maps.Keys(s.vals)) {
		if drop(k) {
			s.bytes -= int64(len(k) + len(s.vals[k]) + EntryOverhead)
			delete(s.vals, k)
			n++
		}
	}
	return n
}

// Get returns the value of key, if it has one. The caller owns the result.
func (s *Store) Get(key string) ([]byte, bool) {
	v, ok := s.vals[key]
	return slices.Clone(v), ok
}

// Stats is what a store holds.
type Stats struct {
	// Keys and Bytes: the keys with a value and what they cost against
	// Limits.MaxBytes.
	Keys  int
	Bytes int64
}

// Stats returns what the store holds.
func (s *Store) Stats() Stats {
	return Stats{Keys: len(s.vals), Bytes: s.bytes}
}

// Entries returns a copy of every key's value (a replica's state digest).
func (s *Store) Entries() map[string][]byte {
	out := make(map[string][]byte, len(s.vals))
	for k, v := range s.vals {
		out[k] = slices.Clone(v)
	}
	return out
}
