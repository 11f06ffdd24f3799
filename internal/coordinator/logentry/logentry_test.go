package logentry_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/gotrain/gotrain/internal/coordinator/job"
	"github.com/gotrain/gotrain/internal/coordinator/logentry"
	"github.com/gotrain/gotrain/internal/coordinator/state"
	gotrainv1 "github.com/gotrain/gotrain/proto/gotrain/v1"
)

var at = time.Date(2026, 12, 2, 8, 0, 0, 0, time.UTC)

func encode(t testing.TB, pe *gotrainv1.LogEntry) []byte {
	t.Helper()
	b, err := logentry.Marshal(logentry.Stamp(pe, at))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// Every entry type decodes to its event, at its time.
func TestDecodeEveryType(t *testing.T) {
	cases := []struct {
		pe   *gotrainv1.LogEntry
		want job.Event
	}{
		{&gotrainv1.LogEntry{Entry: &gotrainv1.LogEntry_Tick{Tick: &gotrainv1.LogTick{}}}, job.Tick{}},
		{&gotrainv1.LogEntry{Entry: &gotrainv1.LogEntry_NodeLost{NodeLost: &gotrainv1.LogNode{NodeId: "node-1", Reason: "gone"}}}, job.NodeLost{NodeID: "node-1", Reason: "gone"}},
		{&gotrainv1.LogEntry{Entry: &gotrainv1.LogEntry_NodeUnreachable{NodeUnreachable: &gotrainv1.LogNode{NodeId: "node-1", Reason: "blip"}}}, job.NodeUnreachable{NodeID: "node-1", Reason: "blip"}},
		{&gotrainv1.LogEntry{Entry: &gotrainv1.LogEntry_NodeReachable{NodeReachable: &gotrainv1.LogNode{NodeId: "node-1"}}}, job.NodeReachable{NodeID: "node-1"}},
		{&gotrainv1.LogEntry{Entry: &gotrainv1.LogEntry_WorkerExit{WorkerExit: &gotrainv1.ReportWorkerExitRequest{NodeId: "node-1", Generation: 2, Rank: 1, Pid: 7, ExitCode: 3, StderrTail: []string{"x"}}}},
			job.WorkerExited{NodeID: "node-1", Generation: 2, Rank: 1, Pid: 7, ExitCode: 3, StderrTail: []string{"x"}}},
		{&gotrainv1.LogEntry{Entry: &gotrainv1.LogEntry_WorkerExit{WorkerExit: &gotrainv1.ReportWorkerExitRequest{NodeId: "node-1", Generation: 1, Pid: 8, Parked: true}}},
			job.WorkerParked{NodeID: "node-1", Generation: 1, Pid: 8}},
		{&gotrainv1.LogEntry{Entry: &gotrainv1.LogEntry_Barrier{Barrier: &gotrainv1.LogBarrier{Name: "b", Generation: 1, Waiter: 1<<40 + 3}}}, job.BarrierArrived{Name: "b", Generation: 1, Waiter: 1<<40 + 3}},
		{&gotrainv1.LogEntry{Entry: &gotrainv1.LogEntry_BarrierCanceled{BarrierCanceled: &gotrainv1.LogBarrierCanceled{Waiter: 9}}}, job.BarrierCanceled{Waiter: 9}},
		{&gotrainv1.LogEntry{Entry: &gotrainv1.LogEntry_Progress{Progress: &gotrainv1.ReportProgressRequest{NodeId: "node-2",
			Ranks: []*gotrainv1.RankProgress{{Rank: 1, Generation: 1, Step: 5, UnixNanos: at.UnixNano()}}}}},
			job.ProgressReported{NodeID: "node-2", Ranks: []job.Progress{{Rank: 1, Generation: 1, Step: 5, Time: at}}}},
		{&gotrainv1.LogEntry{Entry: &gotrainv1.LogEntry_Evidence{Evidence: &gotrainv1.ReportEvidenceRequest{NodeId: "node-1", RequestId: 4,
			Evidence: []*gotrainv1.Evidence{{Rank: 0, Pid: 8, Kind: "stack", Text: "..."}}}}},
			job.EvidenceReported{NodeID: "node-1", VerdictID: 4, Evidence: []job.Evidence{{Rank: 0, Pid: 8, Kind: "stack", Text: "..."}}}},
	}
	for _, c := range cases {
		e, err := logentry.Decode(encode(t, c.pe))
		if err != nil {
			t.Fatalf("%T: %v", c.want, err)
		}
		if !e.Time.Equal(at) || !reflect.DeepEqual(e.Event, c.want) {
			t.Errorf("%T: got %#v at %v, want %#v", c.want, e.Event, e.Time, c.want)
		}
	}
	cfg := state.Config{Job: job.Config{RunID: "r", Nodes: 3, MinNodes: 2, NodeTimeout: 7 * time.Second, MaxRestarts: 2, HangTimeout: time.Minute, OnHang: "restart",
		OnStraggler: "replace", StragglerPersist: 5 * time.Second, StragglerCooldown: time.Minute, Attach: true},
		Peers: []string{"a:1", "b:1"}, Want: 3, NprocPerNode: 8, RanksPerJob: 16}
	e, err := logentry.Decode(encode(t, &gotrainv1.LogEntry{Entry: &gotrainv1.LogEntry_Config{Config: logentry.ConfigToProto(cfg)}}))
	if err != nil || e.Config == nil || !reflect.DeepEqual(*e.Config, cfg) {
		t.Errorf("config: got %+v, %v; want %+v", e.Config, err, cfg)
	}
	req := &gotrainv1.JoinRequest{Node: &gotrainv1.NodeInfo{Hostname: "h", Address: "10.0.0.1", Nproc: 2, AgentPid: 9, FreePort: 5}, Settings: &gotrainv1.JobSettings{MaxRestarts: proto.Int32(2)}}
	e, err = logentry.Decode(encode(t, &gotrainv1.LogEntry{Entry: &gotrainv1.LogEntry_Join{Join: &gotrainv1.LogJoin{Request: req, Host: true, CsrSha256: []byte{1, 2}}}}))
	if err != nil || e.Join == nil || e.Join.Node.Hostname != "h" || e.Join.Node.Nproc != 2 || !e.Join.Host || e.Join.NodeRank != -1 ||
		e.Join.Settings.MaxRestarts == nil || *e.Join.Settings.MaxRestarts != 2 || e.Join.Settings.Nodes != nil {
		t.Errorf("join: got %+v, %v", e.Join, err)
	}
}

// An entry this version cannot read is an error, never skipped: a newer
// entry type, a later version, an empty entry, bytes that are no entry.
func TestDecodeRefusesTheUnknown(t *testing.T) {
	newer := protowire.AppendTag(encode(t, &gotrainv1.LogEntry{}), 99, protowire.BytesType)
	newer = protowire.AppendBytes(newer, []byte("a future entry"))
	later := &gotrainv1.LogEntry{Entry: &gotrainv1.LogEntry_Tick{Tick: &gotrainv1.LogTick{}}}
	b := encode(t, later)
	later.Version = logentry.Version + 1
	lb, _ := proto.Marshal(later)
	for name, raw := range map[string][]byte{"a newer type": newer, "a later version": lb, "empty": encode(t, &gotrainv1.LogEntry{}), "garbage": {0xff, 0xff, 0xff}} {
		if _, err := logentry.Decode(raw); !errors.Is(err, logentry.ErrUnknown) {
			t.Errorf("%s: Decode = %v, want ErrUnknown", name, err)
		}
	}
	if _, err := logentry.Decode(b); err != nil {
		t.Errorf("a tick: %v", err)
	}
}

// Decode never panics, and what it reads applies without panicking to a
// state at any point of a job.
func FuzzDecode(f *testing.F) {
	for _, pe := range sampleEntries() {
		f.Add(encode(f, pe))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		e, err := logentry.Decode(b)
		if err != nil {
			if !errors.Is(err, logentry.ErrUnknown) {
				t.Fatalf("Decode error %v does not wrap ErrUnknown", err)
			}
			return
		}
		st := configured(t)
		st.Apply(e)
	})
}

func configured(t testing.TB) *state.State {
	st, err := state.New(job.Config{RunID: "own"})
	if err != nil {
		t.Fatal(err)
	}
	st.Apply(mustDecode(t, encode(t, &gotrainv1.LogEntry{Entry: &gotrainv1.LogEntry_Config{Config: logentry.ConfigToProto(state.Config{
		Job: job.Config{RunID: "r", Nodes: 3, MaxRestarts: 2}, Peers: []string{"10.0.0.1:29400"}, Want: 3, NprocPerNode: 4, RanksPerJob: 12})}})))
	return st
}

func mustDecode(t testing.TB, b []byte) state.Entry {
	t.Helper()
	e, err := logentry.Decode(b)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func sampleEntries() []*gotrainv1.LogEntry {
	var out []*gotrainv1.LogEntry
	for i := 1; i <= 4; i++ {
		out = append(out, &gotrainv1.LogEntry{Entry: &gotrainv1.LogEntry_Join{Join: &gotrainv1.LogJoin{Request: &gotrainv1.JoinRequest{
			Node: &gotrainv1.NodeInfo{Hostname: fmt.Sprintf("h%d", i), Address: fmt.Sprintf("10.0.0.%d", i), Nproc: 1, AgentPid: 100, FreePort: 2000}}}}})
	}
	return append(out,
		&gotrainv1.LogEntry{Entry: &gotrainv1.LogEntry_Tick{Tick: &gotrainv1.LogTick{}}},
		&gotrainv1.LogEntry{Entry: &gotrainv1.LogEntry_KvPut{KvPut: &gotrainv1.KVPutRequest{Key: "k", Value: []byte("v")}}},
		&gotrainv1.LogEntry{Entry: &gotrainv1.LogEntry_Replica{Replica: &gotrainv1.LogReplica{Addr: "10.0.0.2:29400", NodeId: "node-2"}}},
		&gotrainv1.LogEntry{Entry: &gotrainv1.LogEntry_NodeLost{NodeLost: &gotrainv1.LogNode{NodeId: "node-1", Reason: "gone"}}},
		&gotrainv1.LogEntry{Entry: &gotrainv1.LogEntry_NodeUnreachable{NodeUnreachable: &gotrainv1.LogNode{NodeId: "node-2", Reason: "blip"}}},
		&gotrainv1.LogEntry{Entry: &gotrainv1.LogEntry_NodeReachable{NodeReachable: &gotrainv1.LogNode{NodeId: "node-2"}}},
		&gotrainv1.LogEntry{Entry: &gotrainv1.LogEntry_Progress{Progress: &gotrainv1.ReportProgressRequest{NodeId: "node-2", Ranks: []*gotrainv1.RankProgress{{Rank: 1, Step: 3}}}}},
		&gotrainv1.LogEntry{Entry: &gotrainv1.LogEntry_WorkerExit{WorkerExit: &gotrainv1.ReportWorkerExitRequest{NodeId: "node-3", Rank: 2, ExitCode: 1}}},
		&gotrainv1.LogEntry{Entry: &gotrainv1.LogEntry_Barrier{Barrier: &gotrainv1.LogBarrier{Name: "b", Rank: 0, Waiter: 5}}},
		&gotrainv1.LogEntry{Entry: &gotrainv1.LogEntry_BarrierCanceled{BarrierCanceled: &gotrainv1.LogBarrierCanceled{Waiter: 5}}},
	)
}

// randomLog is a log of n entries drawn from a job's life: joins, the
// replica set, KV puts, progress, barriers, exits, losses, ticks, in a
// random order at advancing times.
func randomLog(t testing.TB, r *rand.Rand, n int) [][]byte {
	now := at
	cfg := &gotrainv1.LogEntry{Entry: &gotrainv1.LogEntry_Config{Config: logentry.ConfigToProto(state.Config{
		Job: job.Config{RunID: "r", Nodes: 4, MinNodes: 2, MaxRestarts: 3, JoinSettle: time.Second, NodeTimeout: 3 * time.Second}, Peers: []string{"10.0.0.1:29400"}, Want: 3, NprocPerNode: 4, RanksPerJob: 16})}}
	out := [][]byte{encode(t, cfg)}
	node := func() string { return fmt.Sprintf("node-%d", 1+r.IntN(5)) }
	for range n {
		now = now.Add(time.Duration(r.IntN(1500)) * time.Millisecond)
		var pe *gotrainv1.LogEntry
		switch r.IntN(10) {
		case 0:
			i := 1 + r.IntN(5)
			pe = &gotrainv1.LogEntry{Entry: &gotrainv1.LogEntry_Join{Join: &gotrainv1.LogJoin{Request: &gotrainv1.JoinRequest{
				Node: &gotrainv1.NodeInfo{Hostname: fmt.Sprintf("h%d", i), Address: fmt.Sprintf("10.0.0.%d", i), Nproc: int32(1 + r.IntN(2)), AgentPid: int32(100 + r.IntN(2)), FreePort: 2000}},
				CsrSha256: []byte{byte(r.IntN(2))}}}}
		case 1:
			i := 2 + r.IntN(4)
			pe = &gotrainv1.LogEntry{Entry: &gotrainv1.LogEntry_Replica{Replica: &gotrainv1.LogReplica{Addr: fmt.Sprintf("10.0.0.%d:29400", i), NodeId: fmt.Sprintf("node-%d", i)}}}
		case 2:
			pe = &gotrainv1.LogEntry{Entry: &gotrainv1.LogEntry_KvPut{KvPut: &gotrainv1.KVPutRequest{Key: fmt.Sprintf("k%d", r.IntN(4)), Value: []byte{byte(r.IntN(2))}}}}
		case 3, 4:
			pe = &gotrainv1.LogEntry{Entry: &gotrainv1.LogEntry_Progress{Progress: &gotrainv1.ReportProgressRequest{NodeId: node(),
				Ranks: []*gotrainv1.RankProgress{{Rank: int32(r.IntN(4)), Generation: int64(r.IntN(3)), Step: int64(r.IntN(100)), UnixNanos: now.UnixNano()}}}}}
		case 5:
			pe = &gotrainv1.LogEntry{Entry: &gotrainv1.LogEntry_Barrier{Barrier: &gotrainv1.LogBarrier{Name: "b", Generation: int64(r.IntN(3)), Rank: int32(r.IntN(4)), Waiter: uint64(r.IntN(1000))}}}
		case 6:
			pe = &gotrainv1.LogEntry{Entry: &gotrainv1.LogEntry_WorkerExit{WorkerExit: &gotrainv1.ReportWorkerExitRequest{NodeId: node(), Generation: int64(r.IntN(3)), Rank: int32(r.IntN(4)), ExitCode: int32(r.IntN(2))}}}
		case 7:
			pe = &gotrainv1.LogEntry{Entry: &gotrainv1.LogEntry_NodeLost{NodeLost: &gotrainv1.LogNode{NodeId: node(), Reason: "gone"}}}
		case 8:
			pe = &gotrainv1.LogEntry{Entry: &gotrainv1.LogEntry_NodeUnreachable{NodeUnreachable: &gotrainv1.LogNode{NodeId: node(), Reason: "blip"}}}
		default:
			pe = &gotrainv1.LogEntry{Entry: &gotrainv1.LogEntry_Tick{Tick: &gotrainv1.LogTick{}}}
		}
		b, err := logentry.Marshal(logentry.Stamp(pe, now))
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, b)
	}
	return out
}

func replay(t testing.TB, st *state.State, log [][]byte) *state.State {
	for _, b := range log {
		st.Apply(mustDecode(t, b))
	}
	return st
}

func fresh(t testing.TB) *state.State {
	st, err := state.New(job.Config{RunID: "own"})
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// Replicas fed the same log hold equal states; a replica restored from a
// snapshot taken at any point, then fed the rest, holds the state of one
// that replayed the whole log.
func TestSnapshotThenReplayIsReplay(t *testing.T) {
	for seed := range uint64(500) {
		r := rand.New(rand.NewPCG(seed, 25))
		log := randomLog(t, r, 20+r.IntN(120))
		a, b := replay(t, fresh(t), log), replay(t, fresh(t), log)
		if a.Digest() != b.Digest() {
			t.Fatalf("seed %d: two replicas fed the same log differ", seed)
		}
		cut := r.IntN(len(log) + 1)
		src := replay(t, fresh(t), log[:cut])
		snap, err := logentry.Snapshot(src)
		if err != nil {
			t.Fatal(err)
		}
		restored, err := logentry.Restore(snap, job.Config{RunID: "own"})
		if err != nil {
			t.Fatalf("seed %d: %v", seed, err)
		}
		if restored.Digest() != src.Digest() || restored.Applied() != uint64(cut) {
			t.Fatalf("seed %d: restored at entry %d: digest or count (%d) differs from the snapshot's source", seed, cut, restored.Applied())
		}
		replay(t, restored, log[cut:])
		replay(t, src, log[cut:])
		if restored.Digest() != a.Digest() || src.Digest() != a.Digest() || restored.Applied() != a.Applied() {
			t.Fatalf("seed %d: snapshot at entry %d of %d then replay differs from replay from the start", seed, cut, len(log))
		}
	}
}

// Restore never panics on a snapshot from another process: it returns an
// error wrapping ErrBadSnapshot or ErrUnknown, or a state whose digest is
// the snapshot's and that takes further entries without panicking.
func FuzzRestore(f *testing.F) {
	for seed := range uint64(4) {
		r := rand.New(rand.NewPCG(seed, 7))
		log := randomLog(f, r, 4+r.IntN(12)) // small: the fuzzer minimizes what it finds
		snap, err := logentry.Snapshot(replay(f, fresh(f), log))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(snap)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		st, err := logentry.Restore(b, job.Config{RunID: "own"})
		if err != nil {
			if !errors.Is(err, logentry.ErrBadSnapshot) && !errors.Is(err, logentry.ErrUnknown) {
				t.Fatalf("Restore error %v wraps neither ErrBadSnapshot nor ErrUnknown", err)
			}
			return
		}
		for _, pe := range sampleEntries() {
			st.Apply(mustDecode(t, encode(t, pe)))
		}
		if _, err := logentry.Snapshot(st); err != nil {
			t.Fatal(err)
		}
	})
}

// Restore refuses a snapshot it cannot trust, saying why.
func TestRestoreRefuses(t *testing.T) {
	var src *state.State
	for seed := uint64(0); src == nil || len(src.Image().Events) == 0; seed++ { // a job whose outboxes hold events
		src = replay(t, fresh(t), randomLog(t, rand.New(rand.NewPCG(seed, 7)), 80))
	}
	good, err := logentry.Snapshot(src)
	if err != nil {
		t.Fatal(err)
	}
	var snap gotrainv1.StateSnapshot
	if err := proto.Unmarshal(good, &snap); err != nil {
		t.Fatal(err)
	}
	edit := func(f func(s *gotrainv1.StateSnapshot)) []byte {
		c := proto.Clone(&snap).(*gotrainv1.StateSnapshot)
		f(c)
		b, err := proto.Marshal(c)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	tables := func(f func(m map[string]any)) func(s *gotrainv1.StateSnapshot) {
		return func(s *gotrainv1.StateSnapshot) {
			var m map[string]any
			if err := json.Unmarshal(s.Tables, &m); err != nil {
				t.Fatal(err)
			}
			f(m)
			b, err := json.Marshal(m)
			if err != nil {
				t.Fatal(err)
			}
			s.Tables = b
		}
	}
	for _, tc := range []struct {
		name string
		snap []byte
		want error
		says string
	}{
		{"not protobuf", []byte{0xff, 0xff, 0xff}, logentry.ErrBadSnapshot, "cannot parse"},
		{"version 1", edit(func(s *gotrainv1.StateSnapshot) { s.Version = 1 }), logentry.ErrUnknown, "version 1"},
		{"tables not JSON", edit(func(s *gotrainv1.StateSnapshot) { s.Tables = []byte("{") }), logentry.ErrBadSnapshot, "tables"},
		{"a table of a later version", edit(tables(func(m map[string]any) { m["Ledger"] = 1 })), logentry.ErrBadSnapshot, "unknown field"},
		{"a key changed", edit(tables(func(m map[string]any) { m["KV"] = map[string]any{"k0": "AQ=="} })), logentry.ErrBadSnapshot, "digest differs"},
		{"applied differs", edit(func(s *gotrainv1.StateSnapshot) { s.Applied++ }), logentry.ErrBadSnapshot, "applied"},
		{"digest cut", edit(func(s *gotrainv1.StateSnapshot) { s.Digest = s.Digest[:5] }), logentry.ErrBadSnapshot, "digest differs"},
		{"an outbox names an event that is not there", edit(tables(func(m map[string]any) {
			m["Outboxes"] = map[string]any{"node-1": map[string]any{"Events": []any{len(m["Events"].([]any))}}}
		})), state.ErrBadImage, "node node-1: event 1 is #"},
		{"an event numbered", edit(tables(func(m map[string]any) { m["Events"].([]any)[0].(map[string]any)["Seq"] = 2 })), state.ErrBadImage, "numbered 2"},
		{"the plan's end is not an end", edit(tables(func(m map[string]any) { m["PlanEnded"] = 0 })), state.ErrBadImage, "not an end"},
		{"a job state unknown", edit(tables(func(m map[string]any) { m["Machine"].(map[string]any)["State"] = "dancing" })), job.ErrBadImage, "dancing"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := logentry.Restore(tc.snap, job.Config{RunID: "own"})
			if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.says) {
				t.Fatalf("Restore: %v; want an error wrapping %v that says %q", err, tc.want, tc.says)
			}
		})
	}
	if _, err := logentry.Restore(good, job.Config{RunID: "own"}); err != nil {
		t.Fatalf("the snapshot unchanged: %v", err)
	}
}
