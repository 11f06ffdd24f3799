package reportq

import (
	"testing"

	gotrainv1 "github.com/gotrain/gotrain/proto/gotrain/v1"
)

func exit(gen int64, rank int32) *gotrainv1.ReportWorkerExitRequest {
	return &gotrainv1.ReportWorkerExitRequest{Generation: gen, Rank: rank}
}

// TestNothingDropped: a thousand ranks exiting together are all kept, in
// the order they exited.
func TestNothingDropped(t *testing.T) {
	q := New()
	for r := range int32(1000) {
		q.Put(exit(0, r))
	}
	got := q.TakeAll()
	if len(got) != 1000 {
		t.Fatalf("took %d reports, want 1000", len(got))
	}
	for i, r := range got {
		if r.GetRank() != int32(i) {
			t.Fatalf("report %d is rank %d: out of order", i, r.GetRank())
		}
	}
	if q.Len() != 0 || len(q.TakeAll()) != 0 {
		t.Fatal("reports left after TakeAll")
	}
}

// TestNewerReportSupersedes: a rank's later exit replaces its earlier one
// that is still waiting, at the end of the queue; a park and an exit of the
// same rank are both kept.
func TestNewerReportSupersedes(t *testing.T) {
	q := New()
	q.Put(exit(0, 0))
	q.Put(exit(0, 1))
	q.Put(&gotrainv1.ReportWorkerExitRequest{Generation: 0, Rank: 1, Parked: true})
	q.Put(exit(1, 0))
	got := q.TakeAll()
	want := []struct {
		rank   int32
		gen    int64
		parked bool
	}{{1, 0, false}, {1, 0, true}, {0, 1, false}}
	if len(got) != len(want) {
		t.Fatalf("took %v, want %v", got, want)
	}
	for i, w := range want {
		if got[i].GetRank() != w.rank || got[i].GetGeneration() != w.gen || got[i].GetParked() != w.parked {
			t.Errorf("report %d = %v, want %+v", i, got[i], w)
		}
	}
}

// TestReadySignalsAPut: a Put wakes a reader; many Puts leave one signal,
// and the reader takes them all.
func TestReadySignalsAPut(t *testing.T) {
	q := New()
	for r := range int32(5) {
		q.Put(exit(0, r))
	}
	<-q.Ready()
	if n := len(q.TakeAll()); n != 5 {
		t.Fatalf("took %d, want 5", n)
	}
	select {
	case <-q.Ready():
		t.Fatal("a second signal for the same Puts")
	default:
	}
}
