package cudago

import (
	"errors"
	"sync"
	"syscall"
	"testing"
)

// The executor needs no GPU: these tests run in every build.

func TestExecutorRunsOnOneLockedThread(t *testing.T) {
	var setupTID, teardownTID int
	e, err := newExecutor(func() error { setupTID = syscall.Gettid(); return nil }, func() { teardownTID = syscall.Gettid() })
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	tids := make([]int, 64)
	for i := range tids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := e.do(func() error { tids[i] = syscall.Gettid(); return nil }); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	for i, tid := range tids {
		if tid != setupTID {
			t.Fatalf("call %d ran on thread %d, setup on %d: want one thread", i, tid, setupTID)
		}
	}
	e.stop()
	if teardownTID != setupTID {
		t.Errorf("teardown ran on thread %d, setup on %d", teardownTID, setupTID)
	}
}

func TestExecutorSerializesCalls(t *testing.T) {
	e, err := newExecutor(func() error { return nil }, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer e.stop()
	inside, most := 0, 0
	var wg sync.WaitGroup
	for range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = e.do(func() error {
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

func TestExecutorSetupError(t *testing.T) {
	want := errors.New("no device")
	e, err := newExecutor(func() error { return want }, func() { t.Error("teardown ran after a failed setup") })
	if !errors.Is(err, want) || e != nil {
		t.Fatalf("newExecutor = %v, %v; want nil, %v", e, err, want)
	}
}

func TestExecutorErrorsAndStop(t *testing.T) {
	e, err := newExecutor(func() error { return nil }, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := errors.New("cuMemAlloc")
	if err := e.do(func() error { return want }); !errors.Is(err, want) {
		t.Errorf("do returned %v, want %v", err, want)
	}
	e.stop()
	e.stop() // twice is fine
	ran := false
	if err := e.do(func() error { ran = true; return nil }); !errors.Is(err, ErrClosed) || ran {
		t.Errorf("do after stop: err %v, ran %v; want ErrClosed and not run", err, ran)
	}
}

func TestExecutorPanicReachesCaller(t *testing.T) {
	e, err := newExecutor(func() error { return nil }, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer e.stop()
	func() {
		defer func() {
			if recover() == nil {
				t.Error("a panic on the thread did not reach the caller")
			}
		}()
		_ = e.do(func() error { panic("boom") })
	}()
	if err := e.do(func() error { return nil }); err != nil {
		t.Errorf("the thread did not survive a panic: %v", err)
	}
}
