package leaderconn_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/gotrain/gotrain/internal/leaderconn"
	gotrainv1 "github.com/gotrain/gotrain/proto/gotrain/v1"
)

// The verdict depends on every replica's state, whatever their order.
func TestNoMajority(t *testing.T) {
	t0 := time.Date(2026, 12, 2, 0, 0, 0, 0, time.UTC)
	at := t0.Add(time.Second)
	refused := status.Error(codes.Unavailable, "connection error: desc = \"transport: Error while dialing: dial tcp 10.0.0.1:29400: connect: connection refused\"")
	noLeader := status.Error(codes.Unavailable, "coordinator replica 10.0.0.3:29400 has had no leader for 5s: no majority of the replica set answers")
	timeout := status.Error(codes.Unavailable, "leaderconn: coordinator replica 10.0.0.2:29400 did not answer /gotrain.v1.Coordinator/ReportProgress within 1s")
	st := func(addr string, h leaderconn.Heard, err error) leaderconn.ReplicaState {
		return leaderconn.ReplicaState{Addr: addr, Heard: h, At: at, Err: err}
	}
	a, b, c := "10.0.0.1:29400", "10.0.0.2:29400", "10.0.0.3:29400"
	for _, tc := range []struct {
		name string
		rs   []leaderconn.ReplicaState
		want string // "" for no verdict
	}{
		{"two refused, one without a leader",
			[]leaderconn.ReplicaState{st(a, leaderconn.Unreachable, refused), st(b, leaderconn.Unreachable, refused), st(c, leaderconn.NoLeader, noLeader)},
			"no majority of the coordinator's 3 replicas answers with a leader: 10.0.0.1:29400 refused the connection, 10.0.0.2:29400 refused the connection, 10.0.0.3:29400 has no leader"},
		{"all refused (the survivor stopped too)",
			[]leaderconn.ReplicaState{st(a, leaderconn.Unreachable, refused), st(b, leaderconn.Unreachable, refused), st(c, leaderconn.Unreachable, refused)},
			"no majority of the coordinator's 3 replicas answers with a leader: 10.0.0.1:29400 refused the connection, 10.0.0.2:29400 refused the connection, 10.0.0.3:29400 refused the connection"},
		{"cut off, its own replica leaderless",
			[]leaderconn.ReplicaState{st(a, leaderconn.Unreachable, timeout), st(b, leaderconn.Unreachable, timeout), st(c, leaderconn.NoLeader, noLeader)},
			"no majority of the coordinator's 3 replicas answers with a leader: 10.0.0.1:29400 did not answer in time, 10.0.0.2:29400 did not answer in time, 10.0.0.3:29400 has no leader"},
		{"two down, one names a dead leader",
			[]leaderconn.ReplicaState{st(a, leaderconn.Unreachable, refused), st(b, leaderconn.Unreachable, refused), {Addr: c, Heard: leaderconn.NamesLeader, Leader: a, At: at}},
			"no majority of the coordinator's 3 replicas answers with a leader: 10.0.0.1:29400 refused the connection, 10.0.0.2:29400 refused the connection, 10.0.0.3:29400 names 10.0.0.1:29400 as the leader"},
		{"one answers", []leaderconn.ReplicaState{st(a, leaderconn.Unreachable, refused), st(b, leaderconn.Unreachable, refused), st(c, leaderconn.Answers, nil)}, ""},
		{"one down only", []leaderconn.ReplicaState{st(a, leaderconn.Unreachable, refused), st(b, leaderconn.NamesLeader, nil), st(c, leaderconn.NamesLeader, nil)}, ""},
		{"not all heard from since", []leaderconn.ReplicaState{st(a, leaderconn.Unreachable, refused), {Addr: b, Heard: leaderconn.Unreachable, At: t0.Add(-time.Second), Err: refused}, {Addr: c}}, ""},
		{"a single coordinator", []leaderconn.ReplicaState{st(a, leaderconn.Unreachable, refused)}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got, want := leaderconn.AllRefused(tc.rs, t0), strings.HasPrefix(tc.name, "all refused") || tc.name == "a single coordinator"; got != want {
				t.Errorf("AllRefused = %v, want %v", got, want)
			}
			// Every order of the same states gives the same verdict (up
			// to the order in which they are listed).
			for i := range tc.rs {
				rs := append(append([]leaderconn.ReplicaState(nil), tc.rs[i:]...), tc.rs[:i]...)
				err := leaderconn.NoMajority(rs, t0)
				switch {
				case tc.want == "" && err != nil:
					t.Errorf("rotation %d: %v, want no verdict", i, err)
				case tc.want != "" && err == nil:
					t.Errorf("rotation %d: no verdict, want %q", i, tc.want)
				case tc.want != "" && i == 0 && err.Error() != tc.want:
					t.Errorf("verdict\n%s\nwant\n%s", err, tc.want)
				}
			}
		})
	}
}

// Replicas says what each replica last answered: a stopped one is
// unreachable, followers that know no leader have none, and the one that
// serves answers; a call that the caller gives up on records nothing.
func TestReplicasHeard(t *testing.T) {
	c := &cluster{}
	rs := startReplicas(t, c, 3)
	c.set(rs[2].addr, true)
	lc, client := newConn(t, addrs(rs...))
	for _, r := range lc.Replicas() {
		if r.Heard != leaderconn.NotTried {
			t.Errorf("%s: heard %v before any call", r.Addr, r.Heard)
		}
	}
	status1(t, client) // rs[0] names rs[2], which answers
	got := lc.Replicas()
	if got[0].Heard != leaderconn.NamesLeader || got[0].Leader != rs[2].addr || got[1].Heard != leaderconn.NotTried || got[2].Heard != leaderconn.Answers {
		t.Errorf("after a redirect: %+v", got)
	}
	// The leader and one follower die; the other knows no leader.
	since := time.Now()
	rs[2].srv.Stop()
	rs[0].srv.Stop()
	c.set("", false)
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Second)
	defer cancel()
	_, err := client.GetJobStatus(ctx, &gotrainv1.GetJobStatusRequest{})
	if err == nil {
		t.Fatal("a call without a leader succeeded")
	}
	got = lc.Replicas()
	for i, want := range []leaderconn.Heard{leaderconn.Unreachable, leaderconn.NoLeader, leaderconn.Unreachable} {
		if got[i].Heard != want || got[i].At.Before(since) {
			t.Errorf("replica %d: heard %v at %v, want %v since %v (err %v)", i, got[i].Heard, got[i].At, want, since, got[i].Err)
		}
	}
	v := leaderconn.NoMajority(got, since)
	if v == nil || !strings.Contains(v.Error(), rs[1].addr+" has no leader") || !strings.Contains(v.Error(), rs[0].addr+" refused the connection") {
		t.Errorf("verdict %v; want no majority, %s without a leader, %s refusing", v, rs[1].addr, rs[0].addr)
	}
	// A call the caller cancels says nothing about the replica.
	before := lc.Replicas()
	cctx, ccancel := context.WithCancel(t.Context())
	ccancel()
	if _, err := client.GetJobStatus(cctx, &gotrainv1.GetJobStatusRequest{}); !errors.Is(err, context.Canceled) && status.Code(err) != codes.Canceled {
		t.Errorf("canceled call: %v", err)
	}
	for i, r := range lc.Replicas() {
		if r.At != before[i].At {
			t.Errorf("replica %d: a canceled call was recorded: %+v", i, r)
		}
	}
}
