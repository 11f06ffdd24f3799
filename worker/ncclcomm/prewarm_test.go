package ncclcomm

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/gotrain/gotrain/gpu/cudadrv"
	"github.com/gotrain/gotrain/nccl"
	"github.com/gotrain/gotrain/worker/comm/commtest"
)

// A prewarm whose driver does not load records nothing and ends; NCCL's load
// still runs beside it.
func TestWarmupWithoutDriver(t *testing.T) {
	w := &warmup{start: time.Now(), done: make(chan struct{})}
	noDriver := errors.New("no driver here")
	w.run(0,
		func() (*cudadrv.Driver, error) { return nil, noDriver },
		func() (*nccl.Library, error) { return nil, nil })
	select {
	case <-w.done:
	default:
		t.Fatal("run returned before done was closed")
	}
	if !w.driver.IsZero() || !w.context.IsZero() {
		t.Errorf("driver %v, context %v: want zero times without a driver", w.driver, w.context)
	}
	if !errors.Is(w.err, noDriver) {
		t.Errorf("err = %v, want the driver's", w.err)
	}
	if w.nccl.IsZero() {
		t.Error("NCCL's load did not run beside the driver's")
	}
}

// PrewarmComm's communicator needs the context: without a driver it is
// never attempted, and nothing is recorded for it.
func TestWarmupCommNeedsTheContext(t *testing.T) {
	called := false
	w := &warmup{start: time.Now(), done: make(chan struct{}),
		comm: func(cudadrv.Context, *nccl.Library) error { called = true; return nil }}
	w.run(0,
		func() (*cudadrv.Driver, error) { return nil, errors.New("no driver here") },
		func() (*nccl.Library, error) { return nil, nil })
	if called || !w.commDone.IsZero() {
		t.Errorf("comm called=%v at %v without a driver: want neither", called, w.commDone)
	}
}

// Without a driver, Prewarm does nothing and New still says what is missing,
// the same words as without Prewarm.
func TestPrewarmWithoutDriverNewReportsIt(t *testing.T) {
	_, loadErr := cudadrv.Load()
	if loadErr == nil {
		t.Skip("a CUDA driver is here; this test is for machines without one")
	}
	Prewarm(0)
	Prewarm(0) // a second call does nothing
	warmMu.Lock()
	w := warms[0]
	warmMu.Unlock()
	select {
	case <-w.done:
	case <-time.After(10 * time.Second):
		t.Fatal("the prewarm did not end")
	}
	if start, drv, ctx, comm := warmTimes(0); start.IsZero() || !drv.IsZero() || !ctx.IsZero() || !comm.IsZero() {
		t.Errorf("warmTimes = %v, %v, %v, %v: want a start and no driver, context or communicator", start, drv, ctx, comm)
	}
	_, err := New(t.Context(), Config{Name: "x", Rank: 1, Size: 2, Device: 0, Store: commtest.NewMemStore()})
	if err == nil {
		t.Fatal("New without a driver succeeded")
	}
	if !strings.Contains(err.Error(), "rank 1") || !strings.Contains(err.Error(), loadErr.Error()) {
		t.Errorf("New: %v\nwant the rank and the driver's error: %v", err, loadErr)
	}
	Prewarm(-1) // no device: nothing to do, no panic
}

func TestInitConfigSharesResources(t *testing.T) {
	c := &Comm{tuning: Tuning{MinCTAs: 2, MaxCTAs: 8}, splitShare: true}
	cfg := c.initConfig("grad/3")
	if !cfg.NonBlocking {
		t.Error("the init communicator must be non-blocking (ctx can abandon it)")
	}
	if v, ok := cfg.SplitShare.Value(); !ok || v != 1 {
		t.Errorf("SplitShare = %v, %v: want 1 (the split shares the init communicator's resources)", v, ok)
	}
	if v, _ := cfg.MinCTAs.Value(); v != 2 {
		t.Errorf("MinCTAs = %d, want the tuning's 2 (the split gets at most its parent's channels)", v)
	}
	if v, _ := cfg.MaxCTAs.Value(); v != 8 {
		t.Errorf("MaxCTAs = %d, want 8", v)
	}
	if cfg.CommName != "grad/3/init" {
		t.Errorf("CommName = %q", cfg.CommName)
	}
	c.splitShare = false
	if _, ok := c.initConfig("grad/3").SplitShare.Value(); ok {
		t.Error("NoSplitShare: SplitShare is set; want it left to NCCL")
	}
}
