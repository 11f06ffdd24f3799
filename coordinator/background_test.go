package coordinator

import (
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// close stops the timers not yet fired, waits for the functions running,
// and drops what comes after it.
func TestBackgroundClose(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var b background
		var late atomic.Bool
		b.after(time.Hour, func() { late.Store(true) })
		fired := make(chan struct{})
		b.after(time.Second, func() { close(fired) })
		<-fired
		release := make(chan struct{})
		var running atomic.Bool
		running.Store(true)
		b.do(func() { <-release; running.Store(false) })

		closed := make(chan struct{})
		go func() { b.close(); close(closed) }()
		synctest.Wait()
		select {
		case <-closed:
			t.Fatal("close returned while a function was running")
		default:
		}
		close(release)
		<-closed
		if running.Load() {
			t.Fatal("close returned before the function running returned")
		}
		b.do(func() { t.Error("do after close ran its function") })
		b.after(0, func() { t.Error("after after close ran its function") })
		time.Sleep(2 * time.Hour)
		synctest.Wait()
		if late.Load() {
			t.Error("a timer pending at close fired")
		}
	})
}
