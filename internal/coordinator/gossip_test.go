package coordinator

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
	"google.golang.org/grpc/codes"

	"github.com/gotrain/gotrain/internal/coordinator/job"
	"github.com/gotrain/gotrain/internal/gossip"
	gotrainv1 "github.com/gotrain/gotrain/proto/gotrain/v1"
)

func TestGossipLost(t *testing.T) {
	for _, tc := range []struct {
		name   string
		state  memberlist.NodeStateType
		silent time.Duration
		want   job.NodeLost
		lost   bool
	}{
		{"node-2", memberlist.StateDead, 2460 * time.Millisecond,
			job.NodeLost{NodeID: "node-2", Reason: "gossip: no answer from 10.0.0.2 for 2.5s (declared dead by the other nodes)"}, true},
		{"node-2", memberlist.StateDead, 0,
			job.NodeLost{NodeID: "node-2", Reason: "gossip: no answer from 10.0.0.2 (declared dead by the other nodes)"}, true},
		{"node-2", memberlist.StateLeft, time.Second, job.NodeLost{}, false}, // left on purpose: its stream tells
		// memberlist v0.7's NotifyLeave passes the state the node joined with.
		{"node-2", memberlist.StateAlive, time.Second,
			job.NodeLost{NodeID: "node-2", Reason: "gossip: no answer from 10.0.0.2 for 1s (declared dead by the other nodes)"}, true},
		{gossip.CoordinatorName, memberlist.StateDead, time.Second, job.NodeLost{}, false},
	} {
		got, lost := gossipLost(tc.name, tc.state, "10.0.0.2", tc.silent)
		if got != tc.want || lost != tc.lost {
			t.Errorf("gossipLost(%q, %v, %s) = %+v, %t; want %+v, %t", tc.name, tc.state, tc.silent, got, lost, tc.want, tc.lost)
		}
	}
}

func TestDefaultGossipPort(t *testing.T) {
	for listen, want := range map[string]int{"0.0.0.0:29400": 29401, "127.0.0.1:0": 0, "[::1]:80": 81, "x": 0, ":65535": 0} {
		if got := DefaultGossipPort(listen); got != want {
			t.Errorf("DefaultGossipPort(%q) = %d, want %d", listen, got, want)
		}
	}
}

// TestGossipDeadIsNodeLost: memberlist declaring an agent dead makes its node
// unreachable like a broken stream, while the stream is still open; after
// the node timeout it is lost, the stream then ends, and a second report (or
// the stream's end) changes nothing.
func TestGossipDeadIsNodeLost(t *testing.T) {
	srv, addr := startServer(t, Config{Job: job.Config{Nodes: 2, MaxRestarts: 3}}, testHooks{})
	ctx := rpcCtx(t)
	a := join(t, newClient(t, addr), "host-a", "10.0.0.1", 1, 2222)
	b := join(t, newClient(t, addr), "host-b", "10.0.0.2", 1, 1111)
	resA := runAgent(ctx, a, func(context.Context, int64, *gotrainv1.RankAssignment) (int32, string, bool) {
		return 0, "", false
	})
	bs := b.watch(ctx)
	if ev, err := bs.Recv(); err != nil || ev.GetStarted() == nil {
		t.Fatalf("host-b: first event = %v, %v; want started", ev, err)
	}

	t0 := time.Unix(1000, 0)
	now := t0
	d := &gossipEvents{s: srv, now: func() time.Time { return now }, heard: map[string]time.Time{}}
	dead := &memberlist.Node{Name: b.id, Addr: net.ParseIP("10.0.0.2"), State: memberlist.StateDead}
	d.NotifyJoin(&memberlist.Node{Name: b.id, Addr: dead.Addr, State: memberlist.StateAlive})
	now = t0.Add(time.Second)
	d.NotifyPingComplete(dead, time.Millisecond, nil)
	now = t0.Add(3 * time.Second)
	d.NotifyLeave(dead)
	d.NotifyLeave(dead) // again: ignored

	fin := waitFinished(t, srv)
	if fin.GetSucceeded() || fin.GetFailure().GetHostname() != "host-b" ||
		!strings.Contains(fin.GetMessage(), "gossip: no answer from 10.0.0.2 for 2s") {
		t.Errorf("result = %v", fin)
	}
	got := <-resA
	if len(got.events) != 3 || !strings.Contains(got.events[1], `gossip: no answer from 10.0.0.2 for 2s`) {
		t.Errorf("host-a: events %q, err %v", got.events, got.err)
	}
	// The lost node's open stream ends: its agent stops its workers.
	for {
		_, err := bs.Recv()
		if err != nil {
			wantCode(t, "host-b's stream after gossip lost it", err, codes.Aborted)
			break
		}
	}
	if again := srv.Result(); again.GetMessage() != fin.GetMessage() {
		t.Errorf("result changed: %v", again)
	}
}

// TestGossipAfterStreamBreak: the stream broke first; gossip's late verdict
// on the same node is ignored.
func TestGossipAfterStreamBreak(t *testing.T) {
	srv, addr := startServer(t, Config{Job: job.Config{Nodes: 2}}, testHooks{})
	ctx := rpcCtx(t)
	a := join(t, newClient(t, addr), "host-a", "10.0.0.1", 1, 2222)
	b := join(t, newClient(t, addr), "host-b", "10.0.0.2", 1, 1111)
	resA := runAgent(ctx, a, func(context.Context, int64, *gotrainv1.RankAssignment) (int32, string, bool) {
		return 0, "", false
	})
	bctx, breakStream := context.WithCancel(ctx)
	bs := b.watch(bctx)
	if ev, err := bs.Recv(); err != nil || ev.GetStarted() == nil {
		t.Fatalf("host-b: first event = %v, %v; want started", ev, err)
	}
	breakStream()
	fin := waitFinished(t, srv)
	d := &gossipEvents{s: srv, now: time.Now, heard: map[string]time.Time{}}
	d.NotifyLeave(&memberlist.Node{Name: b.id, Addr: net.ParseIP("10.0.0.2"), State: memberlist.StateDead})
	<-resA
	if !strings.Contains(fin.GetMessage(), "its agent disconnected") || strings.Contains(srv.Result().GetMessage(), "gossip") {
		t.Errorf("result = %v", srv.Result())
	}
}

// TestStartGossip: the coordinator's member list runs and Join hands out its port.
func TestStartGossip(t *testing.T) {
	srv, addr := startServer(t, Config{Job: job.Config{Nodes: 2}}, testHooks{})
	port, stop, err := srv.StartGossip(GossipConfig{BindAddr: "127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	if port <= 0 {
		t.Fatalf("gossip port %d", port)
	}
	resp, err := newClient(t, addr).Join(rpcCtx(t), &gotrainv1.JoinRequest{Node: &gotrainv1.NodeInfo{Hostname: "h", Address: "10.0.0.1", Nproc: 1, FreePort: 1}})
	if err != nil || int(resp.GetGossipPort()) != port {
		t.Fatalf("join: %v, %v; want gossip port %d", resp, err, port)
	}
}
