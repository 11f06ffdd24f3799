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
		b.start()
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

// Work asked for before start waits for it (a Server that never serves
// starts no goroutine), then runs at its time; close before start drops it.
func TestBackgroundStart(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var b background
		var ran atomic.Int32
		b.do(func() { ran.Add(1) })
		b.after(time.Second, func() { ran.Add(10) })
		b.after(time.Hour, func() { ran.Add(100) })
		time.Sleep(2 * time.Second)
		synctest.Wait()
		if n := ran.Load(); n != 0 {
			t.Fatalf("before start: ran %d, want nothing", n)
		}
		b.start() // 2 s in: the 1 s timer is due, the 1 h one 58 min 58 s on
		synctest.Wait()
		if n := ran.Load(); n != 11 {
			t.Fatalf("at start: ran %d, want 11 (do and the timer due)", n)
		}
		time.Sleep(time.Hour - 3*time.Second)
		synctest.Wait()
		if n := ran.Load(); n != 11 {
			t.Fatalf("before the hour: ran %d, want 11", n)
		}
		time.Sleep(2 * time.Second)
		synctest.Wait()
		if n := ran.Load(); n != 111 {
			t.Fatalf("after the hour: ran %d, want 111", n)
		}
		b.close()

		var never background
		never.do(func() { t.Error("work of a background closed before start ran") })
		never.after(0, func() { t.Error("a timer of a background closed before start ran") })
		never.close()
		never.start()
		synctest.Wait()
	})
}
