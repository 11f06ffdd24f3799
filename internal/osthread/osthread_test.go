package osthread

import (
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func TestRunsOnOneLockedThread(t *testing.T) {
	var tid, teardownTID atomic.Int64
	e, err := Start(func() error { tid.Store(int64(unix.Gettid())); return nil }, func() { teardownTID.Store(int64(unix.Gettid())) })
	if err != nil {
		t.Fatal(err)
	}
	// Callers from many goroutines, with pauses long enough that the thread
	// goes to sleep between some calls.
	var wg sync.WaitGroup
	var wrong atomic.Int64
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 50 {
				err := e.Do(func() error {
					if int64(unix.Gettid()) != tid.Load() {
						wrong.Add(1)
					}
					return nil
				})
				if err != nil {
					t.Error(err)
				}
				if (g+i)%10 == 0 {
					time.Sleep(2 * spinFor)
				}
			}
		}()
	}
	wg.Wait()
	if wrong.Load() != 0 {
		t.Fatalf("%d calls ran on another thread than the executor's", wrong.Load())
	}
	if tid.Load() == int64(unix.Gettid()) && runtime.GOMAXPROCS(0) > 1 {
		t.Log("the executor shares the test's thread (unexpected but harmless)")
	}
	e.Stop()
	if teardownTID.Load() != tid.Load() {
		t.Errorf("teardown ran on thread %d, setup on %d", teardownTID.Load(), tid.Load())
	}
}

func TestSerializesCalls(t *testing.T) {
	e, err := Start(func() error { return nil }, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Stop()
	inside, most := 0, 0
	var wg sync.WaitGroup
	for range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = e.Do(func() error {
				inside++ // a data race (go test -race) if calls overlap
				most = max(most, inside)
				inside--
				return nil
			})
		}()
	}
	wg.Wait()
	if most != 1 {
		t.Errorf("%d calls ran at once, want 1", most)
	}
}

func TestSetupFailure(t *testing.T) {
	bad := errors.New("no device")
	e, err := Start(func() error { return bad }, func() { t.Error("teardown ran after a failed setup") })
	if err != bad || e != nil {
		t.Fatalf("Start = %v, %v; want nil and the setup error", e, err)
	}
}

func TestReturnsErrorsAndStops(t *testing.T) {
	var tornDown atomic.Bool
	e, err := Start(func() error { return nil }, func() { tornDown.Store(true) })
	if err != nil {
		t.Fatal(err)
	}
	boom := errors.New("boom")
	if err := e.Do(func() error { return boom }); err != boom {
		t.Fatalf("Do: %v, want boom", err)
	}
	// A slow function: the caller stops polling and sleeps.
	if err := e.Do(func() error { time.Sleep(5 * spinFor); return nil }); err != nil {
		t.Fatal(err)
	}
	// After a pause the thread sleeps; the next call must wake it.
	time.Sleep(5 * spinFor)
	if err := e.Do(func() error { return nil }); err != nil {
		t.Fatal(err)
	}
	e.Stop()
	if !tornDown.Load() {
		t.Error("teardown did not run")
	}
	ran := false
	if err := e.Do(func() error { ran = true; return nil }); !errors.Is(err, ErrStopped) || ran {
		t.Errorf("Do after Stop: err %v, ran %v; want ErrStopped and not run", err, ran)
	}
	e.Stop() // twice is fine
}

func TestPanicReachesCaller(t *testing.T) {
	var tid atomic.Int64
	e, err := Start(func() error { tid.Store(int64(unix.Gettid())); return nil }, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Stop()
	for _, tc := range []struct {
		name string
		fn   func() error
	}{
		{"while the caller polls", func() error { panic("boom") }},
		// The caller stops polling and sleeps: the panic must wake it.
		{"while the caller sleeps", func() error { time.Sleep(5 * spinFor); panic("boom") }},
	} {
		func() {
			defer func() {
				v := recover()
				if v == nil {
					t.Errorf("%s: a panic on the thread did not reach the caller", tc.name)
				} else if !strings.Contains(fmt.Sprint(v), "boom") {
					t.Errorf("%s: the caller's panic %q does not carry the thread's (boom)", tc.name, v)
				}
			}()
			_ = e.Do(tc.fn)
		}()
		onThread := false
		if err := e.Do(func() error { onThread = int64(unix.Gettid()) == tid.Load(); return nil }); err != nil || !onThread {
			t.Errorf("%s: the thread did not survive the panic: err %v, on the locked thread %v", tc.name, err, onThread)
		}
	}
}

// BenchmarkExecutor measures one hand-off to the executor's thread and back
// while both sides poll: the overhead every ncclcomm.Comm call adds to its
// CUDA or NCCL work.
func BenchmarkExecutor(b *testing.B) {
	e, err := Start(func() error { return nil }, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer e.Stop()
	nop := func() error { return nil }
	for b.Loop() {
		e.Do(nop)
	}
}
