package flight

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/gotrain/gotrain/worker/comm"
)

// fake is a one-rank backend whose next call fails with err.
type fake struct{ err error }

func (f *fake) Rank() int { return 0 }
func (f *fake) Size() int { return 1 }
func (f *fake) AllReduce(context.Context, comm.Buffer, comm.Buffer, comm.Op) error {
	return f.err
}
func (f *fake) Broadcast(context.Context, comm.Buffer, int) error         { return f.err }
func (f *fake) AllGather(context.Context, comm.Buffer, comm.Buffer) error { return f.err }
func (f *fake) ReduceScatter(context.Context, comm.Buffer, comm.Buffer, comm.Op) error {
	return f.err
}
func (f *fake) Barrier(context.Context) error { return f.err }
func (f *fake) Close() error                  { return nil }

func TestWrapRecords(t *testing.T) {
	be := &fake{}
	rec := NewRecorder("grads", 3)
	failures := 0
	rec.OnFailure(func() { failures++ })
	c := Wrap(be, rec)
	ctx := t.Context()
	buf := make([]float32, 8)
	if err := c.AllReduce(ctx, comm.Host(buf), comm.Host(buf), comm.Sum); err != nil {
		t.Fatal(err)
	}
	if err := c.Broadcast(ctx, comm.Host(buf), 0); err != nil {
		t.Fatal(err)
	}
	s := rec.Snapshot()
	if s.Entered != 2 || s.Completed != 2 || s.HasPending || s.CompletedAt == 0 || s.Last.Op != OpBroadcast || s.Last.Peer != 0 {
		t.Fatalf("after two collectives: %+v", s)
	}
	be.err = errors.New("peer went away")
	if err := c.AllGather(ctx, comm.Host(buf[:2]), comm.Host(buf)); err == nil {
		t.Fatal("want the backend's error")
	}
	s = rec.Snapshot()
	if s.Entered != 3 || s.Completed != 2 || !s.HasPending || s.Pending.Op != OpAllGather || s.Pending.State != Failed ||
		s.Pending.Count != 2 || s.ErrSeq != 3 || s.Err != "peer went away" || failures != 1 {
		t.Fatalf("after a failure: %+v failures=%d", s, failures)
	}
	// The ring keeps the last 3.
	be.err = nil
	_ = c.Barrier(ctx)
	es := rec.Entries()
	if len(es) != 3 || es[0].Seq != 2 || es[2].Seq != 4 || es[2].Op != OpBarrier {
		t.Fatalf("entries: %+v", es)
	}
	var b strings.Builder
	if err := rec.Dump(&b, 0); err != nil || !strings.Contains(b.String(), "#3 allgather float32 count=2 failed") {
		t.Fatalf("dump: %v\n%s", err, b.String())
	}
	if c.Unwrap() != comm.Comm(be) {
		t.Fatal("Unwrap does not return the backend")
	}
}

// tracked is an async backend: it completes collectives itself.
type tracked struct {
	fake
	rec *Recorder
}

func (t *tracked) TrackWith(r *Recorder) { t.rec = r }

func TestTrackerCompletes(t *testing.T) {
	be := &tracked{}
	rec := NewRecorder("g", 0)
	c := Wrap(be, rec)
	if be.rec != rec {
		t.Fatal("TrackWith was not called")
	}
	buf := make([]float32, 4)
	_ = c.AllReduce(t.Context(), comm.Host(buf), comm.Host(buf), comm.Avg)
	_ = c.AllReduce(t.Context(), comm.Host(buf), comm.Host(buf), comm.Avg)
	if s := rec.Snapshot(); s.Completed != 0 || s.Pending.State != Enqueued || s.Pending.Seq != 1 {
		t.Fatalf("before the backend completes: %+v", s)
	}
	rec.Start(1)
	rec.Complete(2) // out of order: #1 is still running
	if s := rec.Snapshot(); s.Completed != 0 || s.Pending.State != Started {
		t.Fatalf("after #2 completed: %+v", s)
	}
	rec.Complete(1)
	if s := rec.Snapshot(); s.Completed != 2 || s.HasPending {
		t.Fatalf("after both completed: %+v", s)
	}
}

func TestRecordDoesNotAllocate(t *testing.T) {
	c := Wrap(&fake{}, NewRecorder("g", 16))
	buf := comm.Host(make([]float32, 4))
	ctx := context.Background()
	if n := testing.AllocsPerRun(100, func() { _ = c.AllReduce(ctx, buf, buf, comm.Sum) }); n != 0 {
		t.Errorf("a recorded collective allocates %v times", n)
	}
}

func BenchmarkRecord(b *testing.B) {
	c := Wrap(&fake{}, NewRecorder("g", DefaultSize))
	buf := comm.Host(make([]float32, 4))
	ctx := context.Background()
	for b.Loop() {
		_ = c.AllReduce(ctx, buf, buf, comm.Sum)
	}
}

// A snapshot carries the waits of the latest completed collectives, in seq
// order, for the coordinator's straggler check.
func TestSnapshotRecentWaits(t *testing.T) {
	rec := NewRecorder("grads", 64)
	for i := 1; i <= 20; i++ {
		seq := rec.Enqueue(OpAllReduce, comm.Float32, comm.Sum, 4, -1, 0, true)
		if i == 18 {
			time.Sleep(5 * time.Millisecond) // seq 18 waits at least this long
		}
		rec.Complete(seq)
	}
	pending := rec.Enqueue(OpAllReduce, comm.Float32, comm.Sum, 4, -1, 0, true)
	s := rec.Snapshot()
	if s.RecentFirst != 20-RecentCount+1 || len(s.RecentWaits) != RecentCount {
		t.Fatalf("recent waits from #%d, %d of them; want from #%d, %d", s.RecentFirst, len(s.RecentWaits), 20-RecentCount+1, RecentCount)
	}
	if w := s.RecentWaits[18-s.RecentFirst]; w < 5*time.Millisecond {
		t.Errorf("#18 waited %s, want at least 5ms", w)
	}
	rec.Complete(pending)
	if s := rec.Snapshot(); s.RecentFirst != 21-RecentCount+1 {
		t.Errorf("after #21: recent waits from #%d", s.RecentFirst)
	}
}
