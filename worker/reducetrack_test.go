package worker

import (
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gotrain/gotrain/internal/testing/testkit"
	"github.com/gotrain/gotrain/worker/flight"
)

// fakeMark is a step mark the test passes by hand.
type fakeMark struct {
	passed atomic.Bool
	err    atomic.Pointer[error]
}

func (m *fakeMark) Done() (bool, error) {
	if e := m.err.Load(); e != nil {
		return false, *e
	}
	return m.passed.Load(), nil
}

func direct(f func() error) error { return f() }

// A step's reductions are entered at launch and complete only once the
// step's mark has passed on the device: what the hang detector needs to
// tell a rank that never entered a reduction from one stuck in it.
func TestReduceTrackerCompletesAtTheMark(t *testing.T) {
	rec := flight.NewRecorder("grads", 64)
	m1, m2 := &fakeMark{}, &fakeMark{}
	tr := newReduceTracker(rec, direct, 2)
	defer tr.close()
	for range 3 {
		tr.launched(1000, 0)
	}
	tr.stepEnd(m1)
	tr.launched(1000, 0)
	tr.stepEnd(m2)
	time.Sleep(20 * time.Millisecond)
	if s := rec.Snapshot(); s.Entered != 4 || s.Completed != 0 || !s.HasPending || s.Pending.Seq != 1 || s.Pending.Op != flight.OpAllReduce {
		t.Fatalf("before the marks pass: %+v, want 4 entered, none completed, #1 allreduce pending", s)
	}
	m1.passed.Store(true)
	testkit.WaitFor(t, 10*time.Second, "the first step's 3 reductions complete", func() bool { return rec.Snapshot().Completed == 3 })
	if s := rec.Snapshot(); s.Pending.Seq != 4 {
		t.Fatalf("pending %d, want #4 (the second step's)", s.Pending.Seq)
	}
	m2.passed.Store(true)
	testkit.WaitFor(t, 10*time.Second, "the second step completes", func() bool { return rec.Snapshot().Completed == 4 })
}

// A failed query fails the step's reductions in the recorder; close returns
// at once even while a mark never passes.
func TestReduceTrackerFailsAndStops(t *testing.T) {
	rec := flight.NewRecorder("grads", 64)
	bad, stuck := &fakeMark{}, &fakeMark{}
	e := errors.New("device lost")
	bad.err.Store(&e)
	tr := newReduceTracker(rec, direct, 2)
	tr.launched(10, 0)
	tr.stepEnd(bad)
	testkit.WaitFor(t, 10*time.Second, "the failure recorded", func() bool { return rec.Snapshot().ErrSeq == 1 })
	tr.launched(10, 0)
	tr.stepEnd(stuck)
	done := make(chan struct{})
	go func() { tr.close(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("close waits for a mark that never passes")
	}
	if s := rec.Snapshot(); s.Entered != 2 {
		t.Errorf("entered %d, want 2", s.Entered)
	}
}
