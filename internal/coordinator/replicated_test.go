package coordinator

import (
	"context"
	"fmt"
	"reflect"
	"slices"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/gotrain/gotrain/internal/coordinator/job"
	"github.com/gotrain/gotrain/internal/coordinator/logentry"
	"github.com/gotrain/gotrain/internal/coordinator/state"
	gotrainv1 "github.com/gotrain/gotrain/proto/gotrain/v1"
)

// t0 is the tests' log time.
var t0 = time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)

// applier applies entries to s as Raft would (encoded, through its FSM),
// failing the test on an entry that fails.
func applier(t *testing.T, s *Server) func(time.Time, *gotrainv1.LogEntry) state.Result {
	f := s.FSM()
	return func(at time.Time, e *gotrainv1.LogEntry) state.Result {
		t.Helper()
		b, err := logentry.Marshal(logentry.Stamp(e, at))
		if err != nil {
			t.Fatal(err)
		}
		r, _ := f.Apply(b).(state.Result)
		if r.Err != nil {
			t.Fatalf("apply %v: %v", e, r.Err)
		}
		return r
	}
}

func configEntry(c state.Config) *gotrainv1.LogEntry {
	return &gotrainv1.LogEntry{Entry: &gotrainv1.LogEntry_Config{Config: logentry.ConfigToProto(c)}}
}

func joinEntry(req *gotrainv1.JoinRequest) *gotrainv1.LogEntry {
	return &gotrainv1.LogEntry{Entry: &gotrainv1.LogEntry_Join{Join: &gotrainv1.LogJoin{Request: req}}}
}

func replicaEntry(addr, node string) *gotrainv1.LogEntry {
	return &gotrainv1.LogEntry{Entry: &gotrainv1.LogEntry_Replica{Replica: &gotrainv1.LogReplica{Addr: addr, NodeId: node}}}
}

// A replica restored from a snapshot holds what the one that took it held:
// the same machine (nodes, generation, ranks), KV values and outboxes.
func TestSnapshotRestore(t *testing.T) {
	cfg := Config{Job: job.Config{RunID: "run", Nodes: 2}, Token: "t"}
	a, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	fa := a.FSM()
	apply := applier(t, a)
	apply(t0, configEntry(state.Config{Job: a.st.Machine().Config(), Peers: []string{"10.0.0.1:29400"}, Want: 3}))
	var ids []string
	for i, host := range []string{"host-a", "host-b"} {
		req := &gotrainv1.JoinRequest{Node: &gotrainv1.NodeInfo{Hostname: host, Address: "10.0.0." + string(rune('1'+i)), Nproc: 1, FreePort: 2000, AgentPid: 100}}
		ids = append(ids, apply(t0, joinEntry(req)).Join.ID)
	}
	apply(t0, &gotrainv1.LogEntry{Entry: &gotrainv1.LogEntry_KvPut{KvPut: &gotrainv1.KVPutRequest{Key: "k", Value: []byte("v")}}})
	for i := range 5 {
		apply(t0.Add(time.Duration(i)*time.Second), &gotrainv1.LogEntry{Entry: &gotrainv1.LogEntry_Progress{Progress: &gotrainv1.ReportProgressRequest{NodeId: ids[0]}}})
		apply(t0.Add(time.Duration(i)*time.Second), eventEntry(job.Tick{}))
	}
	apply(t0.Add(6*time.Second), replicaEntry("10.0.0.2:29400", ""))

	snap, err := fa.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	var held gotrainv1.StateSnapshot
	if err := proto.Unmarshal(snap, &held); err != nil {
		t.Fatal(err)
	}
	if held.GetVersion() != logentry.SnapshotVersion || held.GetApplied() != 15 || len(held.GetTables()) == 0 {
		t.Errorf("snapshot version %d of %d entries applied, %d bytes of tables; want version %d of 15", held.GetVersion(), held.GetApplied(), len(held.GetTables()), logentry.SnapshotVersion)
	}
	b, err := New(Config{Job: job.Config{RunID: "other", Nodes: 2}, Token: "t"})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.FSM().Restore(snap); err != nil {
		t.Fatal(err)
	}
	sa, sb := a.st.Machine().Status(), b.st.Machine().Status()
	if sa.State != sb.State || sa.Generation != sb.Generation || len(sa.Nodes) != len(sb.Nodes) || len(sa.Ranks) != len(sb.Ranks) || b.st.Machine().Config().RunID != "run" {
		t.Errorf("restored status %+v (run %s), want %+v", sb, b.st.Machine().Config().RunID, sa)
	}
	if v, ok := storeOf(b, "k").Get("k"); !ok || string(v) != "v" {
		t.Errorf("restored KV k = %q, %v", v, ok)
	}
	for _, id := range ids {
		oa, ob := a.st.Outbox(id), b.st.Outbox(id)
		if ob == nil || !reflect.DeepEqual(oa, ob) {
			t.Fatalf("restored outbox of %s: %+v, want %+v", id, ob, oa)
		}
	}
	// host-a (10.0.0.1) runs the first replica: only host-b was asked.
	if !reflect.DeepEqual(b.st.Peers(), []string{"10.0.0.1:29400", "10.0.0.2:29400"}) || !b.st.Asked(ids[1]) || b.st.Asked(ids[0]) {
		t.Errorf("restored replica set %v, asked %v %v", b.st.Peers(), b.st.Asked(ids[0]), b.st.Asked(ids[1]))
	}
	// The whole state is alike: its digest.
	if a.st.Digest() != b.st.Digest() || a.st.Applied() != b.st.Applied() {
		t.Errorf("restored state digest %x (%d applied), want %x (%d)", b.st.Digest(), b.st.Applied(), a.st.Digest(), a.st.Applied())
	}
}

// Embedded: a replica lost with its node leaves the set, and the first
// node on a host without a replica is asked to host one in its place.
func TestLostReplicaReplaced(t *testing.T) {
	s, err := New(Config{Job: job.Config{RunID: "run", Nodes: 4, MinNodes: 3}, Token: "t"})
	if err != nil {
		t.Fatal(err)
	}
	apply := applier(t, s)
	apply(t0, configEntry(state.Config{Job: s.st.Machine().Config(), Peers: []string{"10.0.0.1:29400"}, Want: 3}))
	var asked []bool
	for i := range 4 {
		req := &gotrainv1.JoinRequest{Node: &gotrainv1.NodeInfo{Hostname: fmt.Sprintf("host-%d", i+1), Address: fmt.Sprintf("10.0.0.%d", i+1), Nproc: 1, FreePort: 2000, AgentPid: 100}}
		asked = append(asked, apply(t0, joinEntry(req)).Join.HostReplica)
	}
	if !slices.Equal(asked, []bool{false, true, true, false}) {
		t.Fatalf("asked to host a replica at join: %v, want the 2nd and 3rd node only", asked)
	}
	apply(t0, replicaEntry("10.0.0.2:29400", "node-2"))
	apply(t0, replicaEntry("10.0.0.3:29400", "node-3"))
	apply(t0.Add(time.Second), eventEntry(job.NodeLost{NodeID: "node-1", Reason: "SIGKILL"}))
	if !slices.Equal(s.st.Peers(), []string{"10.0.0.2:29400", "10.0.0.3:29400"}) {
		t.Errorf("replica set after node-1's loss: %v", s.st.Peers())
	}
	evs := s.st.Outbox("node-4").Events
	if len(evs) == 0 || !evs[len(evs)-1].HostReplica {
		t.Fatalf("node-4 was not asked to host a replica: %+v", evs)
	}
	for _, id := range []string{"node-2", "node-3"} {
		for _, ev := range s.st.Outbox(id).Events {
			if ev.HostReplica {
				t.Errorf("%s, which hosts a replica, was asked to host another", id)
			}
		}
	}
}

// A KVGet waiting on a replica whose state a snapshot replaces returns the
// snapshot's value at once: it used to wait on the replaced store, which
// no put would ever wake.
func TestKVWaitAcrossRestore(t *testing.T) {
	a, err := New(Config{Job: job.Config{RunID: "run", Nodes: 2}, Token: "t"})
	if err != nil {
		t.Fatal(err)
	}
	fa := a.FSM()
	apply := applier(t, a)
	apply(t0, configEntry(state.Config{Job: a.st.Machine().Config(), Peers: []string{"10.0.0.1:29400"}}))
	apply(t0, &gotrainv1.LogEntry{Entry: &gotrainv1.LogEntry_KvPut{KvPut: &gotrainv1.KVPutRequest{Key: "k", Value: []byte("v")}}})
	snap, err := fa.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	b, err := New(Config{Job: job.Config{RunID: "run", Nodes: 2}, Token: "t"})
	if err != nil {
		t.Fatal(err)
	}
	waiting := make(chan string, 1)
	b.hooks.kvWaiting = func(key string) { waiting <- key }
	fb := b.FSM()
	ctx, cancel := context.WithTimeout(t.Context(), rpcTimeout)
	defer cancel()
	got := make(chan *gotrainv1.KVGetResponse, 1)
	go func() {
		r, err := b.KVGet(ctx, &gotrainv1.KVGetRequest{Key: "k", WaitMs: 10 * 60_000})
		if err != nil {
			t.Error(err)
		}
		got <- r
	}()
	<-waiting
	if err := fb.Restore(snap); err != nil {
		t.Fatal(err)
	}
	if r := <-got; !r.GetFound() || string(r.GetValue()) != "v" {
		t.Errorf("KVGet across the restore = %v, want v", r)
	}
}
