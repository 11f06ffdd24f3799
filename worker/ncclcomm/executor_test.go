package ncclcomm

import (
	"errors"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func TestExecutorRunsOnOneThread(t *testing.T) {
	var tid atomic.Int64
	e, err := newExecutor(func() error { tid.Store(int64(unix.Gettid())); return nil }, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer e.stop()
	// Callers from many goroutines, with pauses long enough that the thread
	// goes to sleep between some calls.
	var wg sync.WaitGroup
	var wrong atomic.Int64
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 50 {
				err := e.do(func() error {
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
}

func TestExecutorReturnsErrorsAndStops(t *testing.T) {
	var tornDown atomic.Bool
	e, err := newExecutor(func() error { return nil }, func() { tornDown.Store(true) })
	if err != nil {
		t.Fatal(err)
	}
	boom := errors.New("boom")
	if err := e.do(func() error { return boom }); err != boom {
		t.Fatalf("do: %v, want boom", err)
	}
	// A slow function: the caller stops polling and sleeps.
	if err := e.do(func() error { time.Sleep(5 * spinFor); return nil }); err != nil {
		t.Fatal(err)
	}
	// After a pause the thread sleeps; the next call must wake it.
	time.Sleep(5 * spinFor)
	if err := e.do(func() error { return nil }); err != nil {
		t.Fatal(err)
	}
	e.stop()
	if !tornDown.Load() {
		t.Error("teardown did not run")
	}
	if err := e.do(func() error { return nil }); !errors.Is(err, errExecutorStopped) {
		t.Errorf("do after stop: %v, want errExecutorStopped", err)
	}
	e.stop() // twice is fine
}

func TestExecutorSetupFailure(t *testing.T) {
	bad := errors.New("no device")
	if _, err := newExecutor(func() error { return bad }, nil); err != bad {
		t.Fatalf("newExecutor: %v, want the setup error", err)
	}
}

func TestDeviceFor(t *testing.T) {
	for _, tc := range []struct {
		gpu     int
		visible string
		want    int
	}{
		{3, "3", 0}, {3, "", 3}, {-1, "", 0}, {1, "0,1", 1}, {2, "GPU-abc", 0},
	} {
		got := DeviceFor(tc.gpu, func(k string) string {
			if k == "CUDA_VISIBLE_DEVICES" {
				return tc.visible
			}
			return ""
		})
		if got != tc.want {
			t.Errorf("DeviceFor(%d, CUDA_VISIBLE_DEVICES=%q) = %d, want %d", tc.gpu, tc.visible, got, tc.want)
		}
	}
}

func TestConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		cfg  Config
		want string
	}{
		{Config{Name: "x", Size: 0}, "size is 0"},
		{Config{Name: "x", Size: 2, Rank: 2}, "rank 2 is out of range"},
		{Config{Size: 1}, "needs a Name"},
		{Config{Name: "x", Size: 1, Device: -1}, "device is -1"},
		{Config{Name: "x", Size: 2, Rank: 1}, "Store is nil"},
	} {
		err := tc.cfg.validate()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("validate(%+v) = %v, want %q", tc.cfg, err, tc.want)
		}
	}
	if err := (&Config{Name: "x", Size: 1}).validate(); err != nil {
		t.Errorf("a valid config: %v", err)
	}
}

// BenchmarkExecutor measures one hand-off to the executor's thread and back
// while both sides poll: the overhead every Comm call adds to its CUDA or
// NCCL work.
func BenchmarkExecutor(b *testing.B) {
	e, err := newExecutor(func() error { return nil }, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer e.stop()
	nop := func() error { return nil }
	for b.Loop() {
		e.do(nop)
	}
}
