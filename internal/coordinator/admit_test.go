package coordinator

import (
	"context"
	"github.com/gotrain/gotrain/internal/coordinator/job"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"

	gotrainv1 "github.com/gotrain/gotrain/proto/gotrain/v1"
)

// joinAsHost joins like the agent that embeds the coordinator: with its
// host key.
func joinAsHost(t *testing.T, c gotrainv1.CoordinatorClient, host, addr string, port int32, key []byte) (*agent, error) {
	t.Helper()
	resp, err := c.Join(rpcCtx(t), &gotrainv1.JoinRequest{Node: &gotrainv1.NodeInfo{
		Hostname: host, Address: addr, Nproc: 1, AgentPid: 4001, FreePort: port,
	}, HostKey: key})
	if err != nil {
		return nil, err
	}
	return &agent{t: t, c: c, host: host, id: resp.GetNodeId()}, nil
}

// Rank 0 squatting: a token holder that joins first, named to
// sort first, used to become group rank 0 and MASTER_ADDR. The node whose
// agent runs the coordinator (it proves so with the host key) is group
// rank 0 whoever joined before it, and a wrong host key is refused.
func TestSquatterCannotTakeRankZero(t *testing.T) {
	key := []byte("0123456789abcdef0123456789abcdef")
	_, addr := startServer(t, Config{Job: job.Config{Nodes: 2}, HostKey: key}, testHooks{})
	squatter := join(t, newClient(t, addr), "aaa", "10.9.9.9", 1, 31337)
	if _, err := joinAsHost(t, newClient(t, addr), "aab", "10.9.9.8", 31338, []byte("a guess")); err == nil {
		t.Fatal("a join with a wrong host key was taken")
	} else {
		wantCode(t, "join with a wrong host key", err, codes.PermissionDenied)
	}
	real, err := joinAsHost(t, newClient(t, addr), "zz-real", "10.0.0.1", 2222, key)
	if err != nil {
		t.Fatal(err)
	}
	ctx := rpcCtx(t)
	cases := []struct {
		a      *agent
		want   string
		stream grpc.ServerStreamingClient[gotrainv1.GenerationEvent]
	}{
		{a: real, want: "started gen=0 world=2 group=0/2 restarts=0 master=10.0.0.1:2222 ranks=0/0/-1"},
		{a: squatter, want: "started gen=0 world=2 group=1/2 restarts=0 master=10.0.0.1:2222 ranks=1/0/0"},
	}
	for i := range cases { // both attach: the job starts once they have
		cases[i].stream = cases[i].a.watch(ctx)
	}
	for _, c := range cases {
		ev, err := c.stream.Recv()
		if err != nil {
			t.Fatalf("%s: %v", c.a.host, err)
		}
		if got := describe(ev); got != c.want {
			t.Errorf("%s: first event %q, want %q", c.a.host, got, c.want)
		}
	}
}

// A squatter of a coordinator without a host (standalone) gets group rank
// 0 by joining first, reports exit 0 for its rank and leaves: the real
// node's rank, waiting in its rendezvous, used to wait until killed. Now
// the job fails, naming the squatter.
func TestSquatterLeavingBeforeTheFirstStepFailsTheJob(t *testing.T) {
	srv, addr := startServer(t, Config{Job: job.Config{Nodes: 2}}, testHooks{})
	squatter := join(t, newClient(t, addr), "aaa", "10.9.9.9", 1, 31337)
	real := join(t, newClient(t, addr), "real", "10.0.0.1", 1, 2222)
	ctx := rpcCtx(t)
	resReal := runAgent(ctx, real, func(ctx context.Context, _ int64, _ *gotrainv1.RankAssignment) (int32, string, bool) {
		select { // waits in its rendezvous at the squatter's MASTER_ADDR
		case <-ctx.Done():
		case <-srv.Finished():
		}
		return 0, "", false
	})
	sctx, leave := context.WithCancel(ctx)
	ev, err := squatter.watch(sctx).Recv()
	if err != nil || ev.GetStarted().GetGroupRank() != 0 {
		t.Fatalf("squatter's first event %v, %v: want group rank 0", ev, err)
	}
	if _, err := squatter.c.ReportWorkerExit(ctx, &gotrainv1.ReportWorkerExitRequest{NodeId: squatter.id, Generation: 0, Rank: 0, Pid: 666}); err != nil {
		t.Fatal(err)
	}
	leave()
	res := waitFinished(t, srv)
	f := res.GetFailure()
	if res.GetSucceeded() || f.GetHostname() != "aaa" || f.GetRank() != 0 || !strings.Contains(f.GetReason(), "left before the job's first step") {
		t.Errorf("result %v: want a failure naming aaa's rank 0, which left before the first step", res)
	}
	got := <-resReal
	if n := len(got.events); n != 3 || !strings.HasPrefix(got.events[1], "ended gen=0 failure=rank 0 on aaa") || got.events[2] != "finished succeeded=false exit=1" {
		t.Errorf("real node's events %q: want started, ended naming aaa, finished exit=1", got.events)
	}
}
