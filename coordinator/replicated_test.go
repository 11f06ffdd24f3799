package coordinator

import (
	"fmt"
	"reflect"
	"slices"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/gotrain/gotrain/coordinator/job"
	gotrainv1 "github.com/gotrain/gotrain/proto/gotrain/v1"
)

// Every event type survives the log's encoding: a type gob does not know
// would stop replication at the first such event.
func TestEntryRoundTrip(t *testing.T) {
	at := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	events := []job.Event{
		job.NodeJoined{NodeID: "node-1", Info: job.NodeInfo{Hostname: "a", Address: "10.0.0.1", Nproc: 2}},
		job.NodeLost{NodeID: "node-1", Reason: "gone"},
		job.WorkerExited{NodeID: "node-1", Generation: 2, Rank: 1, Pid: 7, ExitCode: 3, StderrTail: []string{"x"}},
		job.BarrierArrived{Name: "b", Generation: 1, Rank: 0, Waiter: 1<<40 + 3},
		job.BarrierCanceled{Waiter: 9},
		job.ProgressReported{NodeID: "node-2", Ranks: []job.Progress{{Rank: 1, Generation: 1, Step: 5, Time: at}}},
		job.Tick{},
		job.NodeUnreachable{NodeID: "node-1", Reason: "blip"},
		job.NodeReachable{NodeID: "node-1"},
		job.WorkerParked{NodeID: "node-1", Generation: 1, Rank: 0, Pid: 8},
		job.EvidenceReported{NodeID: "node-1", VerdictID: 4, Evidence: []job.Evidence{{Rank: 0, Pid: 8, Kind: "stack", Text: "..."}}},
	}
	for _, ev := range events {
		b, err := entry{Time: at, Event: ev}.encode()
		if err != nil {
			t.Fatalf("%T: %v", ev, err)
		}
		got, err := decodeEntry(b)
		if err != nil {
			t.Fatalf("%T: %v", ev, err)
		}
		if !got.Time.Equal(at) || !reflect.DeepEqual(got.Event, ev) {
			t.Errorf("%T: got %#v at %v, want %#v", ev, got.Event, got.Time, ev)
		}
	}
}

// t0 is the tests' log time.
var t0 = time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)

// applier applies entries to s as Raft would (encoded, through its FSM),
// failing the test on an entry that fails.
func applier(t *testing.T, s *Server) func(entry) applied {
	f := s.FSM()
	return func(e entry) applied {
		t.Helper()
		b, err := e.encode()
		if err != nil {
			t.Fatal(err)
		}
		r, _ := f.Apply(b).(applied)
		if r.err != nil {
			t.Fatalf("apply %+v: %v", e, r.err)
		}
		return r
	}
}

// A replica restored from a snapshot holds what the one that took it held:
// the same machine (nodes, generation, ranks), KV values and outboxes;
// progress reports superseded by later ones are left out of the snapshot.
func TestSnapshotRestore(t *testing.T) {
	cfg := Config{RunID: "run", Token: "t", Nodes: 2}
	a, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	fa := a.FSM()
	apply := applier(t, a)
	apply(entry{Time: t0, Config: &configEntry{Job: a.m.Config(), Peers: []string{"10.0.0.1:29400"}, Want: 3}})
	var ids []string
	for i, host := range []string{"host-a", "host-b"} {
		req, _ := proto.Marshal(&gotrainv1.JoinRequest{Node: &gotrainv1.NodeInfo{Hostname: host, Address: "10.0.0." + string(rune('1'+i)), Nproc: 1, FreePort: 2000, AgentPid: 100}})
		ids = append(ids, apply(entry{Time: t0, Join: req}).v.(joinResult).id)
	}
	apply(entry{Time: t0, KV: &kvEntry{Key: "k", Value: []byte("v")}})
	for i := range 5 {
		apply(entry{Time: t0.Add(time.Duration(i) * time.Second), Event: job.ProgressReported{NodeID: ids[0]}})
		apply(entry{Time: t0.Add(time.Duration(i) * time.Second), Event: job.Tick{}})
	}
	apply(entry{Time: t0.Add(6 * time.Second), Replica: "10.0.0.2:29400"})

	snap, err := fa.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	if n := len(a.rs.history); n != 7 { // config, 2 joins, kv, 1 progress, 1 tick, replica
		t.Errorf("snapshot keeps %d entries, want 7", n)
	}
	b, err := New(Config{RunID: "other", Token: "t", Nodes: 2})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.FSM().Restore(snap); err != nil {
		t.Fatal(err)
	}
	sa, sb := a.m.Status(), b.m.Status()
	if sa.State != sb.State || sa.Generation != sb.Generation || len(sa.Nodes) != len(sb.Nodes) || len(sa.Ranks) != len(sb.Ranks) || b.m.Config().RunID != "run" {
		t.Errorf("restored status %+v (run %s), want %+v", sb, b.m.Config().RunID, sa)
	}
	if v, ok := b.kv.Get("k"); !ok || string(v) != "v" {
		t.Errorf("restored KV k = %q, %v", v, ok)
	}
	for _, id := range ids {
		oa, ob := a.outboxes[id], b.outboxes[id]
		if ob == nil || len(oa.events) != len(ob.events) {
			t.Fatalf("restored outbox of %s: %v, want %d events", id, ob, len(oa.events))
		}
		for i := range oa.events {
			if !proto.Equal(oa.events[i], ob.events[i]) {
				t.Errorf("%s event %d: %v, want %v", id, i, ob.events[i], oa.events[i])
			}
		}
	}
	// host-a (10.0.0.1) runs the first replica: only host-b was asked.
	if !reflect.DeepEqual(b.rs.peers, []string{"10.0.0.1:29400", "10.0.0.2:29400"}) || !reflect.DeepEqual(b.rs.asked, []string{ids[1]}) {
		t.Errorf("restored replica set %v, asked %v", b.rs.peers, b.rs.asked)
	}
}

// Embedded: a replica lost with its node leaves the set, and the first
// node on a host without a replica is asked to host one in its place.
func TestLostReplicaReplaced(t *testing.T) {
	s, err := New(Config{RunID: "run", Token: "t", Nodes: 4, MinNodes: 3})
	if err != nil {
		t.Fatal(err)
	}
	apply := applier(t, s)
	apply(entry{Time: t0, Config: &configEntry{Job: s.m.Config(), Peers: []string{"10.0.0.1:29400"}, Want: 3}})
	var asked []bool
	for i := range 4 {
		req, _ := proto.Marshal(&gotrainv1.JoinRequest{Node: &gotrainv1.NodeInfo{Hostname: fmt.Sprintf("host-%d", i+1), Address: fmt.Sprintf("10.0.0.%d", i+1), Nproc: 1, FreePort: 2000, AgentPid: 100}})
		asked = append(asked, apply(entry{Time: t0, Join: req}).v.(joinResult).hostReplica)
	}
	if !slices.Equal(asked, []bool{false, true, true, false}) {
		t.Fatalf("asked to host a replica at join: %v, want the 2nd and 3rd node only", asked)
	}
	apply(entry{Time: t0, Replica: "10.0.0.2:29400", ReplicaNode: "node-2"})
	apply(entry{Time: t0, Replica: "10.0.0.3:29400", ReplicaNode: "node-3"})
	apply(entry{Time: t0.Add(time.Second), Event: job.NodeLost{NodeID: "node-1", Reason: "SIGKILL"}})
	if !slices.Equal(s.rs.peers, []string{"10.0.0.2:29400", "10.0.0.3:29400"}) {
		t.Errorf("replica set after node-1's loss: %v", s.rs.peers)
	}
	evs := s.outboxes["node-4"].events
	if len(evs) == 0 || evs[len(evs)-1].GetHostReplica() == nil {
		t.Fatalf("node-4 was not asked to host a replica: %v", evs)
	}
	for _, id := range []string{"node-2", "node-3"} {
		for _, ev := range s.outboxes[id].events {
			if ev.GetHostReplica() != nil {
				t.Errorf("%s, which hosts a replica, was asked to host another", id)
			}
		}
	}
}
