// Package testkit holds the helpers that tests across the tree share: a
// wait on a condition and a buffer that a running process or goroutine
// writes while the test reads it. One copy, so that every test waits and
// reads the same way.
//
// Usage:
//
//	var out testkit.Buffer
//	cmd.Stdout = &out
//	testkit.WaitFor(t, time.Minute, "the ready line", func() bool {
//		return strings.Contains(out.String(), "ready")
//	})
package testkit

import (
	"bytes"
	"sync"
	"testing"
	"time"
)

// WaitFor polls cond until it holds, failing t (Fatalf, naming what) once
// timeout has passed. cond is checked at least once, so a timeout of 0
// checks that it holds now; cond may fail the test itself (say, when the
// process it waits on ended). It waits on the condition, never on time alone: the
// interval grows from 5 ms to 250 ms, so that a condition that holds soon
// is seen soon, and one that runs a command does not run it back to back.
// It may be called from a cleanup function (the test's context has ended
// by then).
func WaitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for interval := 5 * time.Millisecond; !cond(); interval = min(2*interval, 250*time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(interval) // a polling interval, not synchronisation
	}
}

// Buffer is a bytes.Buffer that may be written and read concurrently (a
// command's output, a logger's writer). The zero value is empty and ready.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

// String returns what was written so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}
