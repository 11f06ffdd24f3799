package logentry_test

import (
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/gotrain/gotrain/internal/coordinator/job"
	"github.com/gotrain/gotrain/internal/coordinator/logentry"
	"github.com/gotrain/gotrain/internal/coordinator/state"
	gotrainv1 "github.com/gotrain/gotrain/proto/gotrain/v1"
)

// An aged job for the snapshot benchmark: nodes of one rank each, restarts
// generations that each fail (rank 0 exits 1, the others stop) after
// progress reports in all (the nodes in turn; each moves its rank's step
// and completed collective).
type agedJob struct{ nodes, restarts, progress int }

var (
	agedMu     sync.Mutex
	agedStates = map[agedJob]*state.State{}
)

// aged returns the state of job j, built once per process (a million
// entries take a while).
func aged(b *testing.B, j agedJob) *state.State {
	agedMu.Lock()
	defer agedMu.Unlock()
	if st := agedStates[j]; st != nil {
		return st
	}
	st, err := state.New(job.Config{RunID: "own"})
	if err != nil {
		b.Fatal(err)
	}
	now := time.Date(2026, 12, 8, 0, 0, 0, 0, time.UTC)
	apply := func(pe *gotrainv1.LogEntry) {
		raw, err := logentry.Marshal(logentry.Stamp(pe, now))
		if err != nil {
			b.Fatal(err)
		}
		e, err := logentry.Decode(raw)
		if err != nil {
			b.Fatal(err)
		}
		if r, _ := st.Apply(e); r.Err != nil {
			b.Fatalf("%T: %v", pe.GetEntry(), r.Err)
		}
	}
	tick := func(d time.Duration) {
		now = now.Add(d)
		apply(&gotrainv1.LogEntry{Entry: &gotrainv1.LogEntry_Tick{Tick: &gotrainv1.LogTick{}}})
	}
	apply(&gotrainv1.LogEntry{Entry: &gotrainv1.LogEntry_Config{Config: logentry.ConfigToProto(state.Config{
		Job: job.Config{RunID: "aged", Nodes: j.nodes, MaxRestarts: j.restarts + 1, JoinSettle: time.Millisecond, RestartBackoff: time.Second,
			NodeTimeout: time.Hour, HangTimeout: time.Hour}, NprocPerNode: 8, RanksPerJob: 8 * j.nodes})}})
	for i := 1; i <= j.nodes; i++ {
		apply(&gotrainv1.LogEntry{Entry: &gotrainv1.LogEntry_Join{Join: &gotrainv1.LogJoin{Request: &gotrainv1.JoinRequest{
			Node: &gotrainv1.NodeInfo{Hostname: fmt.Sprintf("h%d", i), Address: fmt.Sprintf("10.0.%d.%d", i/256, i%256), Nproc: 1, AgentPid: 100, FreePort: 29500}},
			CsrSha256: []byte{byte(i)}}}})
		apply(&gotrainv1.LogEntry{Entry: &gotrainv1.LogEntry_NodeReachable{NodeReachable: &gotrainv1.LogNode{NodeId: fmt.Sprintf("node-%d", i)}}})
	}
	tick(time.Second)
	perGen := j.progress / (j.restarts + 1)
	step := int64(0)
	for gen := int64(0); gen <= int64(j.restarts); gen++ {
		if g := st.Machine().Status().Generation; g != gen {
			b.Fatalf("generation %d runs, want %d: %+v", g, gen, st.Machine().Status())
		}
		for p := range perGen {
			now = now.Add(100 * time.Millisecond)
			rank := p % j.nodes
			step++
			apply(&gotrainv1.LogEntry{Entry: &gotrainv1.LogEntry_Progress{Progress: &gotrainv1.ReportProgressRequest{NodeId: fmt.Sprintf("node-%d", rank+1),
				Ranks: []*gotrainv1.RankProgress{{Rank: int32(rank), Generation: gen, Step: step, UnixNanos: now.UnixNano(), Pid: 100,
					Comms: []*gotrainv1.CommProgress{{Comm: "world", EnteredSeq: step, CompletedSeq: step, CompletedUnixNanos: now.UnixNano()}}}}}}})
		}
		if gen == int64(j.restarts) {
			break
		}
		for rank := range j.nodes {
			apply(&gotrainv1.LogEntry{Entry: &gotrainv1.LogEntry_WorkerExit{WorkerExit: &gotrainv1.ReportWorkerExitRequest{
				NodeId: fmt.Sprintf("node-%d", rank+1), Generation: gen, Rank: int32(rank), ExitCode: 1, Pid: 100}}})
		}
		tick(2 * time.Second) // past the backoff: the next generation
	}
	agedStates[j] = st
	return st
}

// BenchmarkSnapshot measures the snapshot of an aged job: its size
// (snapshot-bytes), the time to take it (take-ns) and to take and restore
// it (ns/op).
//
//	go test -run '^$' -bench Snapshot -benchtime 3x ./internal/coordinator/logentry/
func BenchmarkSnapshot(b *testing.B) {
	for _, j := range []agedJob{{2, 0, 1000}, {2, 0, 1_000_000}, {2, 100, 10_000}, {2, 10_000, 1_000_000}, {64, 100, 100_000}} {
		b.Run(fmt.Sprintf("nodes=%d/restarts=%d/progress=%d", j.nodes, j.restarts, j.progress), func(b *testing.B) {
			st := aged(b, j)
			snap, err := logentry.Snapshot(st)
			if err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			var took time.Duration
			for range b.N {
				start := time.Now()
				if _, err := logentry.Snapshot(st); err != nil {
					b.Fatal(err)
				}
				took += time.Since(start)
				r, err := logentry.Restore(snap, job.Config{RunID: "own"})
				if err != nil {
					b.Fatal(err)
				}
				if r.Digest() != st.Digest() {
					b.Fatal("the restored state differs")
				}
			}
			// ns/op is a snapshot taken and one restored; take-ns the first.
			b.ReportMetric(float64(took.Nanoseconds())/float64(b.N), "take-ns")
			b.ReportMetric(float64(len(snap)), "snapshot-bytes")
			// What the nodes' outboxes (every event since the job began,
			// for a watch stream to resume from) take of it.
			im := st.Image()
			boxes, err := json.Marshal([]any{im.Events, im.Outboxes})
			if err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(float64(len(boxes)), "outbox-bytes")
			machine, err := json.Marshal(im.Machine)
			if err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(float64(len(machine)), "machine-bytes")
		})
	}
}
