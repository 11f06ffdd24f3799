package testkit

import (
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// recorder is a testing.TB whose Fatalf is recorded, and ends the
// goroutine as the real one does.
type recorder struct {
	testing.TB
	failed string
}

func (r *recorder) Helper() {}
func (r *recorder) Fatalf(format string, args ...any) {
	r.failed = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

func TestWaitForReturnsOnceTheConditionHolds(t *testing.T) {
	var n atomic.Int32
	WaitFor(t, time.Minute, "the third call", func() bool { return n.Add(1) >= 3 })
	if got := n.Load(); got != 3 {
		t.Errorf("cond called %d times, want 3", got)
	}
}

func TestWaitForFailsAfterTheTimeout(t *testing.T) {
	r := &recorder{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		WaitFor(r, 20*time.Millisecond, "a condition that never holds", func() bool { return false })
	}()
	<-done
	if !strings.Contains(r.failed, "timed out after 20ms waiting for a condition that never holds") {
		t.Errorf("failure %q, want it to name the timeout and what was awaited", r.failed)
	}
}

func TestBufferTakesConcurrentWrites(t *testing.T) {
	var b Buffer
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 100 {
				_, _ = b.Write([]byte("x"))
				_ = b.String()
			}
		})
	}
	wg.Wait()
	if got := len(b.String()); got != 800 {
		t.Errorf("%d bytes, want 800", got)
	}
}
