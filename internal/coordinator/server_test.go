package coordinator

import (
	"context"
	"errors"
	"fmt"
	"github.com/gotrain/gotrain/internal/coordinator/job"
	"io"
	"log/slog"
	"maps"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/gotrain/gotrain/internal/testing/testkit"
	"github.com/gotrain/gotrain/internal/token"
	gotrainv1 "github.com/gotrain/gotrain/proto/gotrain/v1"
)

const testToken = "test-token"

// rpcTimeout bounds every call a test makes, so that a bug fails the test
// instead of hanging it.
const rpcTimeout = 30 * time.Second

// startServer serves cfg on a loopback TCP port until the test ends
// (startBounded, with hooks).
func startServer(t *testing.T, cfg Config, hooks testHooks) (*Server, string) {
	t.Helper()
	if cfg.Job.NodeTimeout == 0 {
		// A node whose stream broke is lost at the next tick (a second):
		// the tests of loss need not wait out the default 10 s.
		cfg.Job.NodeTimeout = time.Millisecond
	}
	return startBounded(t, cfg, func(s *Server) { s.hooks = hooks })
}

func dial(t *testing.T, addr string, opts ...grpc.DialOption) gotrainv1.CoordinatorClient {
	t.Helper()
	opts = append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, opts...)
	cc, err := grpc.NewClient(addr, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	return gotrainv1.NewCoordinatorClient(cc)
}

func newClient(t *testing.T, addr string) gotrainv1.CoordinatorClient {
	return dial(t, addr, token.DialOption(testToken))
}

func rpcCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), rpcTimeout)
	t.Cleanup(cancel)
	return ctx
}

func wantCode(t *testing.T, what string, err error, want codes.Code) {
	t.Helper()
	if got := status.Code(err); got != want {
		t.Errorf("%s: got %v (%v), want %v", what, got, err, want)
	}
}

// agent is a fake gotrain agent: a real gRPC client that joins, watches its
// generations and reports its workers' exits.
type agent struct {
	t    *testing.T
	c    gotrainv1.CoordinatorClient
	host string
	id   string
	seq  atomic.Uint64 // the last event's seq: a new stream starts after it
}

func join(t *testing.T, c gotrainv1.CoordinatorClient, host, addr string, nproc int32, port int32) *agent {
	t.Helper()
	var gpus []*gotrainv1.GPU
	for i := range nproc {
		gpus = append(gpus, &gotrainv1.GPU{Index: i, Uuid: fmt.Sprintf("GPU-%s-%d", host, i)})
	}
	resp, err := c.Join(rpcCtx(t), &gotrainv1.JoinRequest{Node: &gotrainv1.NodeInfo{
		Hostname: host, Address: addr, Nproc: nproc, Gpus: gpus, AgentPid: 4000, FreePort: port,
	}})
	if err != nil {
		t.Fatalf("join %s: %v", host, err)
	}
	if resp.GetNodeId() == "" || resp.GetRunId() != "run-test" {
		t.Fatalf("join %s: response %v", host, resp)
	}
	return &agent{t: t, c: c, host: host, id: resp.GetNodeId()}
}

func (a *agent) watch(ctx context.Context) grpc.ServerStreamingClient[gotrainv1.GenerationEvent] {
	a.t.Helper()
	stream, err := a.c.WatchGenerations(ctx, &gotrainv1.WatchGenerationsRequest{NodeId: a.id, AfterSeq: a.seq.Load()})
	if err != nil {
		a.t.Fatalf("watch %s: %v", a.host, err)
	}
	return stream
}

// rankFn is what one worker does in a generation. It returns its exit, or
// exits=false to run until the generation ends.
type rankFn func(ctx context.Context, gen int64, r *gotrainv1.RankAssignment) (code int32, signal string, exits bool)

// run acts on the stream's events like an agent until the stream ends: on
// started it runs fn for every rank at once and reports the exits; on ended it
// reports every rank still running as stopped (by SIGTERM). It returns a summary
// of the events and the error that ended the stream (nil for a clean end).
func (a *agent) run(ctx context.Context, stream grpc.ServerStreamingClient[gotrainv1.GenerationEvent], fn rankFn) ([]string, error) {
	var (
		mu      sync.Mutex
		gen     int64 = -1
		running       = map[int32]bool{}
		wg      sync.WaitGroup
		events  []string
	)
	defer wg.Wait()
	report := func(g int64, rank, code int32, signal string, stopped bool) {
		// mu is held.
		if g != gen || !running[rank] {
			return
		}
		delete(running, rank)
		_, err := a.c.ReportWorkerExit(ctx, &gotrainv1.ReportWorkerExitRequest{
			NodeId: a.id, Generation: g, Rank: rank, Pid: 10000 + rank, ExitCode: code, Signal: signal, Stopped: stopped,
			StderrTail: []string{fmt.Sprintf("rank %d says goodbye", rank)},
		})
		if err != nil {
			a.t.Errorf("%s: report exit of rank %d: %v", a.host, rank, err)
		}
	}
	for {
		ev, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return events, nil
		}
		if err != nil {
			return events, err
		}
		a.seq.Store(ev.GetSeq())
		events = append(events, describe(ev))
		switch e := ev.GetEvent().(type) {
		case *gotrainv1.GenerationEvent_Started:
			mu.Lock()
			gen = e.Started.GetGeneration()
			for _, r := range e.Started.GetRanks() {
				running[r.GetRank()] = true
			}
			mu.Unlock()
			for _, r := range e.Started.GetRanks() {
				wg.Go(func() {
					code, sig, exits := fn(ctx, e.Started.GetGeneration(), r)
					if exits {
						mu.Lock()
						report(e.Started.GetGeneration(), r.GetRank(), code, sig, false)
						mu.Unlock()
					}
				})
			}
		case *gotrainv1.GenerationEvent_Ended:
			mu.Lock()
			for _, r := range slices.Sorted(maps.Keys(running)) {
				report(e.Ended.GetGeneration(), r, -1, "SIGTERM", true)
			}
			mu.Unlock()
		}
	}
}

// describe summarizes an event for comparison.
func describe(ev *gotrainv1.GenerationEvent) string {
	switch e := ev.GetEvent().(type) {
	case *gotrainv1.GenerationEvent_Started:
		s := e.Started
		var ranks []string
		for _, r := range s.GetRanks() {
			ranks = append(ranks, fmt.Sprintf("%d/%d/%d", r.GetRank(), r.GetLocalRank(), r.GetGpu()))
		}
		return fmt.Sprintf("started gen=%d world=%d group=%d/%d restarts=%d master=%s:%d ranks=%s",
			s.GetGeneration(), s.GetWorldSize(), s.GetGroupRank(), s.GetGroupWorldSize(), s.GetRestartCount(),
			s.GetMasterAddr(), s.GetMasterPort(), strings.Join(ranks, ","))
	case *gotrainv1.GenerationEvent_Ended:
		f := e.Ended.GetFailure()
		return fmt.Sprintf("ended gen=%d failure=rank %d on %s code %d signal %q reason %q",
			e.Ended.GetGeneration(), f.GetRank(), f.GetHostname(), f.GetExitCode(), f.GetSignal(), f.GetReason())
	case *gotrainv1.GenerationEvent_Finished:
		return fmt.Sprintf("finished succeeded=%t exit=%d", e.Finished.GetSucceeded(), e.Finished.GetExitCode())
	case *gotrainv1.GenerationEvent_Restarting:
		r := e.Restarting
		return fmt.Sprintf("restarting after gen=%d world=%d failure=rank %d attempt %d of %d in %dms",
			r.GetGeneration(), r.GetWorldSize(), r.GetFailure().GetRank(), r.GetAttempt(), r.GetMaxAttempts(), r.GetWaitMs())
	}
	return fmt.Sprintf("unknown event %v", ev)
}

type runResult struct {
	events []string
	err    error
}

// runAgent runs a in the background; the result arrives on the channel.
func runAgent(ctx context.Context, a *agent, fn rankFn) <-chan runResult {
	stream := a.watch(ctx)
	out := make(chan runResult, 1)
	go func() {
		evs, err := a.run(ctx, stream, fn)
		out <- runResult{evs, err}
	}()
	return out
}

func wantEvents(t *testing.T, host string, got runResult, want ...string) {
	t.Helper()
	if got.err != nil {
		t.Errorf("%s: stream ended with %v", host, got.err)
	}
	if !slices.Equal(got.events, want) {
		t.Errorf("%s: events\n got %q\nwant %q", host, got.events, want)
	}
}

func waitFinished(t *testing.T, srv *Server) *gotrainv1.JobFinished {
	t.Helper()
	select {
	case <-srv.Finished():
	case <-time.After(rpcTimeout):
		t.Fatal("the job did not finish")
	}
	return srv.Result()
}

func TestTokenRequired(t *testing.T) {
	_, addr := startServer(t, Config{}, testHooks{})
	for name, c := range map[string]gotrainv1.CoordinatorClient{
		"no token":    dial(t, addr),
		"wrong token": dial(t, addr, token.DialOption("not-"+testToken)),
	} {
		_, err := c.GetJobStatus(rpcCtx(t), &gotrainv1.GetJobStatusRequest{})
		wantCode(t, name+": GetJobStatus", err, codes.PermissionDenied)
		_, err = c.Join(rpcCtx(t), &gotrainv1.JoinRequest{Node: &gotrainv1.NodeInfo{Hostname: "h", Address: "h", Nproc: 1, FreePort: 1}})
		wantCode(t, name+": Join", err, codes.PermissionDenied)
		stream, err := c.WatchGenerations(rpcCtx(t), &gotrainv1.WatchGenerationsRequest{NodeId: "node-1"})
		if err == nil {
			_, err = stream.Recv()
		}
		wantCode(t, name+": WatchGenerations", err, codes.PermissionDenied)
	}
	// Nobody joined: the rejected Join did not count.
	st, err := newClient(t, addr).GetJobStatus(rpcCtx(t), &gotrainv1.GetJobStatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if st.GetState() != "waiting" || len(st.GetNodes()) != 0 {
		t.Errorf("status = %v, want waiting with no nodes", st)
	}
}

// Two agents join (host-b first: the node order is the join order, not
// the names'), meet at a barrier, exchange a value through the KV store,
// exit 0, and the job succeeds.
func TestTwoAgentsSucceed(t *testing.T) {
	srv, addr := startServer(t, Config{Job: job.Config{Nodes: 2}}, testHooks{})
	ctx := rpcCtx(t)
	b := join(t, newClient(t, addr), "host-b", "10.0.0.2", 2, 1111)
	a := join(t, newClient(t, addr), "host-a", "10.0.0.1", 2, 2222)
	work := func(c gotrainv1.CoordinatorClient) rankFn {
		return func(ctx context.Context, gen int64, r *gotrainv1.RankAssignment) (int32, string, bool) {
			if _, err := c.Barrier(ctx, &gotrainv1.BarrierRequest{Name: "init", Generation: gen, Rank: r.GetRank()}); err != nil {
				t.Errorf("rank %d: barrier: %v", r.GetRank(), err)
				return 1, "", true
			}
			key := fmt.Sprintf("nccl/world/%d", gen)
			if r.GetRank() == 0 {
				if _, err := c.KVPut(ctx, &gotrainv1.KVPutRequest{Key: key, Value: []byte("unique-id")}); err != nil {
					t.Errorf("rank 0: put: %v", err)
					return 1, "", true
				}
			}
			resp, err := c.KVGet(ctx, &gotrainv1.KVGetRequest{Key: key, WaitMs: rpcTimeout.Milliseconds()})
			if err != nil || !resp.GetFound() || string(resp.GetValue()) != "unique-id" {
				t.Errorf("rank %d: get = %v, %v", r.GetRank(), resp, err)
				return 1, "", true
			}
			return 0, "", true
		}
	}
	resA := runAgent(ctx, a, work(a.c))
	resB := runAgent(ctx, b, work(b.c))
	res := waitFinished(t, srv)
	if !res.GetSucceeded() || res.GetExitCode() != 0 {
		t.Errorf("result = %v, want success", res)
	}
	wantEvents(t, "host-a", <-resA,
		"started gen=0 world=4 group=1/2 restarts=0 master=10.0.0.2:1111 ranks=2/0/0,3/1/1",
		"finished succeeded=true exit=0")
	wantEvents(t, "host-b", <-resB,
		"started gen=0 world=4 group=0/2 restarts=0 master=10.0.0.2:1111 ranks=0/0/0,1/1/1",
		"finished succeeded=true exit=0")

	st, err := a.c.GetJobStatus(ctx, &gotrainv1.GetJobStatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if st.GetState() != "succeeded" || st.GetWorldSize() != 4 || len(st.GetRanks()) != 4 || len(st.GetNodes()) != 2 {
		t.Errorf("status = %v", st)
	}
	for _, r := range st.GetRanks() {
		if r.GetState() != "exited" {
			t.Errorf("rank %d state %q, want exited", r.GetRank(), r.GetState())
		}
	}
	// A stream opened after the end hears that the job finished.
	again, err := a.watch(ctx).Recv()
	if err != nil || !again.GetFinished().GetSucceeded() {
		t.Errorf("watch after finish: %v, %v", again, err)
	}
}

// Rank 3 fails in generation 0; the generation ends, the agents stop their
// other workers, generation 1 starts with restart count 1 and succeeds.
func TestFailureRestarts(t *testing.T) {
	srv, addr := startServer(t, Config{Job: job.Config{Nodes: 2, MaxRestarts: 1}}, testHooks{})
	ctx := rpcCtx(t)
	a := join(t, newClient(t, addr), "host-a", "10.0.0.1", 2, 2222)
	b := join(t, newClient(t, addr), "host-b", "10.0.0.2", 2, 1111)
	work := func(ctx context.Context, gen int64, r *gotrainv1.RankAssignment) (int32, string, bool) {
		switch {
		case gen == 0 && r.GetRank() == 3:
			return 3, "", true
		case gen == 0:
			return 0, "", false // runs until stopped
		}
		return 0, "", true
	}
	resA := runAgent(ctx, a, work)
	resB := runAgent(ctx, b, work)
	res := waitFinished(t, srv)
	if !res.GetSucceeded() {
		t.Errorf("result = %v, want success", res)
	}
	ended := `ended gen=0 failure=rank 3 on host-b code 3 signal "" reason ""`
	restarting := "restarting after gen=0 world=4 failure=rank 3 attempt 2 of 2 in 0ms" // once every rank stopped
	wantEvents(t, "host-a", <-resA,
		"started gen=0 world=4 group=0/2 restarts=0 master=10.0.0.1:2222 ranks=0/0/0,1/1/1",
		ended,
		restarting,
		"started gen=1 world=4 group=0/2 restarts=1 master=10.0.0.1:2222 ranks=0/0/0,1/1/1",
		"finished succeeded=true exit=0")
	wantEvents(t, "host-b", <-resB,
		"started gen=0 world=4 group=1/2 restarts=0 master=10.0.0.1:2222 ranks=2/0/0,3/1/1",
		ended,
		restarting,
		"started gen=1 world=4 group=1/2 restarts=1 master=10.0.0.1:2222 ranks=2/0/0,3/1/1",
		"finished succeeded=true exit=0")
	st, err := a.c.GetJobStatus(ctx, &gotrainv1.GetJobStatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if st.GetRestartCount() != 1 || st.GetGeneration() != 1 || st.GetFailure().GetRank() != 3 ||
		!slices.Equal(st.GetFailure().GetStderrTail(), []string{"rank 3 says goodbye"}) {
		t.Errorf("status = %v", st)
	}
}

// With no restarts, a worker killed by a signal fails the job with 128+n.
func TestSignalFailsJob(t *testing.T) {
	srv, addr := startServer(t, Config{}, testHooks{})
	a := join(t, newClient(t, addr), "host-a", "10.0.0.1", 1, 2222)
	res := runAgent(rpcCtx(t), a, func(context.Context, int64, *gotrainv1.RankAssignment) (int32, string, bool) {
		return -1, "SIGKILL", true
	})
	fin := waitFinished(t, srv)
	if fin.GetSucceeded() || fin.GetExitCode() != 137 || !strings.Contains(fin.GetMessage(), "rank 0") ||
		!strings.Contains(fin.GetMessage(), "host-a") || !strings.Contains(fin.GetMessage(), "SIGKILL") {
		t.Errorf("result = %v", fin)
	}
	wantEvents(t, "host-a", <-res,
		"started gen=0 world=1 group=0/1 restarts=0 master=10.0.0.1:2222 ranks=0/0/0",
		`ended gen=0 failure=rank 0 on host-a code -1 signal "SIGKILL" reason ""`,
		"finished succeeded=false exit=137")
}

func TestKV(t *testing.T) {
	waiting := make(chan string, 10)
	_, addr := startServer(t, Config{}, testHooks{kvWaiting: func(key string) { waiting <- key }})
	c := newClient(t, addr)
	ctx := rpcCtx(t)

	// A Get that waits returns once the Put happens.
	got := make(chan *gotrainv1.KVGetResponse, 1)
	go func() {
		resp, err := c.KVGet(ctx, &gotrainv1.KVGetRequest{Key: "k", WaitMs: rpcTimeout.Milliseconds()})
		if err != nil {
			t.Errorf("long poll: %v", err)
		}
		got <- resp
	}()
	if key := <-waiting; key != "k" {
		t.Fatalf("waiting for %q, want k", key)
	}
	select {
	case r := <-got:
		t.Fatalf("Get returned %v before the Put", r)
	default:
	}
	if _, err := c.KVPut(ctx, &gotrainv1.KVPutRequest{Key: "k", Value: []byte("v1")}); err != nil {
		t.Fatal(err)
	}
	if r := <-got; !r.GetFound() || string(r.GetValue()) != "v1" {
		t.Errorf("long poll = %v, want v1", r)
	}

	// Puts are write-once.
	_, err := c.KVPut(ctx, &gotrainv1.KVPutRequest{Key: "k", Value: []byte("v1")})
	wantCode(t, "same value again", err, codes.OK)
	_, err = c.KVPut(ctx, &gotrainv1.KVPutRequest{Key: "k", Value: []byte("v2")})
	wantCode(t, "another value", err, codes.AlreadyExists)
	_, err = c.KVPut(ctx, &gotrainv1.KVPutRequest{Value: []byte("v")})
	wantCode(t, "empty key", err, codes.InvalidArgument)

	// Without a wait, or when the wait runs out: not found.
	r, err := c.KVGet(ctx, &gotrainv1.KVGetRequest{Key: "missing"})
	if err != nil || r.GetFound() {
		t.Errorf("get without wait = %v, %v; want not found", r, err)
	}
	r, err = c.KVGet(ctx, &gotrainv1.KVGetRequest{Key: "missing", WaitMs: 20})
	if err != nil || r.GetFound() {
		t.Errorf("get after the wait ran out = %v, %v; want not found", r, err)
	}
	<-waiting
	// The call's deadline ends the wait too.
	short, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	_, err = c.KVGet(short, &gotrainv1.KVGetRequest{Key: "missing", WaitMs: rpcTimeout.Milliseconds()})
	wantCode(t, "get past the deadline", err, codes.DeadlineExceeded)
}

type arrival struct {
	name string
	rank int32
}

func TestBarrier(t *testing.T) {
	arrived := make(chan arrival, 20)
	left := make(chan arrival, 1)
	_, addr := startServer(t, Config{}, testHooks{
		barrierWaiting:  func(name string, rank int32) { arrived <- arrival{name, rank} },
		barrierCanceled: func(name string, rank int32) { left <- arrival{name, rank} },
	})
	c := newClient(t, addr)
	ctx := rpcCtx(t)
	a := join(t, c, "host-a", "10.0.0.1", 3, 2222)
	stream := a.watch(ctx)
	if ev, err := stream.Recv(); err != nil || ev.GetStarted() == nil {
		t.Fatalf("first event = %v, %v; want started", ev, err)
	}
	barrier := func(ctx context.Context, name string, gen int64, rank int32) <-chan error {
		out := make(chan error, 1)
		go func() {
			_, err := c.Barrier(ctx, &gotrainv1.BarrierRequest{Name: name, Generation: gen, Rank: rank})
			out <- err
		}()
		return out
	}
	awaitArrival := func(name string, rank int32) {
		t.Helper()
		if got := <-arrived; got != (arrival{name, rank}) {
			t.Fatalf("arrival %v, want %s rank %d", got, name, rank)
		}
	}

	// Released when all three ranks arrived.
	var calls []<-chan error
	for r := range int32(3) {
		calls = append(calls, barrier(ctx, "init", 0, r))
	}
	for i, call := range calls {
		wantCode(t, fmt.Sprintf("init rank %d", i), <-call, codes.OK)
	}
	for range 3 {
		<-arrived
	}

	// Another generation fails at once; a bad rank is the caller's mistake.
	wantCode(t, "generation 5", <-barrier(ctx, "x", 5, 0), codes.Aborted)
	<-arrived // the hook runs after the answer is ready
	wantCode(t, "rank 7", <-barrier(ctx, "x", 0, 7), codes.InvalidArgument)

	// A canceled call ends with Canceled and its rank no longer counts.
	cctx, cancel := context.WithCancel(ctx)
	canceled := barrier(cctx, "step", 0, 0)
	awaitArrival("step", 0)
	cancel()
	wantCode(t, "canceled", <-canceled, codes.Canceled)
	if got := <-left; got != (arrival{"step", 0}) {
		t.Fatalf("canceled %v, want step rank 0", got)
	}
	step1 := barrier(ctx, "step", 0, 1)
	awaitArrival("step", 1)
	step2 := barrier(ctx, "step", 0, 2)
	awaitArrival("step", 2)

	// The generation ends first: the waiting calls fail with Aborted.
	if _, err := c.ReportWorkerExit(ctx, &gotrainv1.ReportWorkerExitRequest{NodeId: a.id, Generation: 0, Rank: 0, ExitCode: 1}); err != nil {
		t.Fatal(err)
	}
	for _, call := range []<-chan error{step1, step2} {
		err := <-call
		wantCode(t, "step after the end", err, codes.Aborted)
		if !strings.Contains(status.Convert(err).Message(), "generation 0 ended: rank 0") {
			t.Errorf("barrier error %q does not say why", status.Convert(err).Message())
		}
	}
	if ev, err := stream.Recv(); err != nil || ev.GetEnded() == nil {
		t.Errorf("event = %v, %v; want ended", ev, err)
	}
}

// A node whose watch stream breaks is lost; with its ranks gone and no way to
// rejoin, the job fails with exit code 1 once the other node stopped.
func TestStreamBreakIsNodeLost(t *testing.T) {
	srv, addr := startServer(t, Config{Job: job.Config{Nodes: 2, MaxRestarts: 3}}, testHooks{})
	ctx := rpcCtx(t)
	a := join(t, newClient(t, addr), "host-a", "10.0.0.1", 1, 2222)
	b := join(t, newClient(t, addr), "host-b", "10.0.0.2", 1, 1111)
	resA := runAgent(ctx, a, func(context.Context, int64, *gotrainv1.RankAssignment) (int32, string, bool) {
		return 0, "", false // run until stopped
	})
	bctx, breakStream := context.WithCancel(ctx)
	bs := b.watch(bctx)
	if ev, err := bs.Recv(); err != nil || ev.GetStarted() == nil {
		t.Fatalf("host-b: first event = %v, %v; want started", ev, err)
	}
	breakStream()

	fin := waitFinished(t, srv)
	if fin.GetSucceeded() || fin.GetExitCode() != 1 || fin.GetFailure().GetHostname() != "host-b" ||
		!strings.Contains(fin.GetMessage(), "host-b") || !strings.Contains(fin.GetMessage(), "rank 1") {
		t.Errorf("result = %v", fin)
	}
	got := <-resA
	if len(got.events) != 3 || !strings.HasPrefix(got.events[1], `ended gen=0 failure=rank 1 on host-b code 0 signal "" reason "unreachable for `) ||
		!strings.Contains(got.events[1], "its agent disconnected") ||
		got.events[2] != "finished succeeded=false exit=1" || got.err != nil {
		t.Errorf("host-a: events %q, err %v", got.events, got.err)
	}
	// The lost node is gone for good.
	_, err := b.c.ReportWorkerExit(ctx, &gotrainv1.ReportWorkerExitRequest{NodeId: b.id, Generation: 0, Rank: 1})
	wantCode(t, "report from the lost node", err, codes.NotFound)
}

// TestRendezvousTimeout: a job whose second node never joins ends, and the
// node that joined hears why on its stream.
func TestRendezvousTimeout(t *testing.T) {
	srv, addr := startServer(t, Config{Job: job.Config{Nodes: 2, RendezvousTimeout: 200 * time.Millisecond}}, testHooks{})
	a := join(t, newClient(t, addr), "host-a", "10.0.0.1", 1, 2222)
	got := <-runAgent(rpcCtx(t), a, func(context.Context, int64, *gotrainv1.RankAssignment) (int32, string, bool) {
		return 0, "", true
	})
	wantEvents(t, "host-a", got, "finished succeeded=false exit=1")
	fin := waitFinished(t, srv)
	for _, want := range []string{"1 of 2 nodes joined within the rendezvous timeout of 200ms", "node-1 on host-a at 10.0.0.1", "job token"} {
		if !strings.Contains(fin.GetMessage(), want) {
			t.Errorf("message %q lacks %q", fin.GetMessage(), want)
		}
	}
}

func TestCallerMistakes(t *testing.T) {
	_, addr := startServer(t, Config{}, testHooks{})
	c := newClient(t, addr)
	ctx := rpcCtx(t)

	_, err := c.Join(ctx, &gotrainv1.JoinRequest{})
	wantCode(t, "join without node", err, codes.InvalidArgument)
	_, err = c.Join(ctx, &gotrainv1.JoinRequest{Node: &gotrainv1.NodeInfo{Hostname: "h", Address: "h", Nproc: 0, FreePort: 1}})
	wantCode(t, "join with nproc 0", err, codes.InvalidArgument)

	a := join(t, c, "host-a", "10.0.0.1", 2, 2222)
	_, err = c.Join(ctx, &gotrainv1.JoinRequest{Node: &gotrainv1.NodeInfo{Hostname: "host-a", Address: "x", Nproc: 1, FreePort: 1, AgentPid: 4000}})
	wantCode(t, "join after the start", err, codes.FailedPrecondition)

	stream := a.watch(ctx)
	if ev, err := stream.Recv(); err != nil || ev.GetStarted() == nil {
		t.Fatalf("first event = %v, %v", ev, err)
	}
	// A second stream of the node replaces the first (an agent reconnecting
	// after a blip), which ends, superseded (not Aborted: that would end
	// the agent's contact).
	if _, err := c.WatchGenerations(ctx, &gotrainv1.WatchGenerationsRequest{NodeId: a.id}); err != nil {
		t.Fatal(err)
	}
	_, err = stream.Recv()
	wantCode(t, "the replaced stream", err, codes.AlreadyExists)
	unknown, err := c.WatchGenerations(ctx, &gotrainv1.WatchGenerationsRequest{NodeId: "nope"})
	if err == nil {
		_, err = unknown.Recv()
	}
	wantCode(t, "unknown node stream", err, codes.NotFound)

	_, err = c.ReportWorkerExit(ctx, &gotrainv1.ReportWorkerExitRequest{NodeId: a.id, Generation: 0, Rank: 9})
	wantCode(t, "exit of a rank the node does not run", err, codes.InvalidArgument)
	_, err = c.ReportProgress(ctx, &gotrainv1.ReportProgressRequest{NodeId: "nope"})
	wantCode(t, "progress from an unknown node", err, codes.NotFound)

	_, err = c.ReportProgress(ctx, &gotrainv1.ReportProgressRequest{NodeId: a.id, Ranks: []*gotrainv1.RankProgress{{
		Rank: 1, Generation: 0, Step: 42, UnixNanos: 1e18,
		Comms: []*gotrainv1.CommProgress{{Comm: "world", EnteredSeq: 7, CompletedSeq: 6, LastOp: "all_reduce"}},
	}}})
	if err != nil {
		t.Fatal(err)
	}
	st, err := c.GetJobStatus(ctx, &gotrainv1.GetJobStatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	p := st.GetRanks()[1].GetProgress()
	if st.GetState() != "running" || p.GetStep() != 42 || p.GetUnixNanos() != 1e18 || p.GetComms()[0].GetLastOp() != "all_reduce" ||
		st.GetNodes()[0].GetInfo().GetGpus()[1].GetUuid() != "GPU-host-a-1" {
		t.Errorf("status = %v", st)
	}
}

// Stopping the server ends the calls that wait, and Serve returns.
func TestServeStops(t *testing.T) {
	arrived := make(chan arrival, 1)
	srv, err := New(Config{Job: job.Config{RunID: "run-test"}, Token: testToken})
	if err != nil {
		t.Fatal(err)
	}
	srv.hooks.barrierWaiting = func(name string, rank int32) { arrived <- arrival{name, rank} }
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(t.Context())
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ctx, lis) }()

	c := newClient(t, lis.Addr().String())
	a := join(t, c, "host-a", "10.0.0.1", 2, 2222)
	stream := a.watch(rpcCtx(t))
	if ev, err := stream.Recv(); err != nil || ev.GetStarted() == nil {
		t.Fatalf("first event = %v, %v", ev, err)
	}
	waiting := make(chan error, 1)
	go func() {
		_, err := c.Barrier(rpcCtx(t), &gotrainv1.BarrierRequest{Name: "b", Generation: 0, Rank: 0})
		waiting <- err
	}()
	<-arrived
	stop()
	if err := <-served; err != nil {
		t.Errorf("Serve = %v, want nil", err)
	}
	wantCode(t, "barrier at shutdown", <-waiting, codes.Unavailable)
	_, err = stream.Recv()
	wantCode(t, "stream at shutdown", err, codes.Unavailable)
	if err := srv.Serve(t.Context(), lis); err == nil {
		t.Error("second Serve = nil, want an error")
	}
}

// Stopping the server as soon as the job finished still tells every agent.
func TestFinishedReachesAgentsAtShutdown(t *testing.T) {
	srv, err := New(Config{Job: job.Config{RunID: "run-test", Nodes: 2}, Token: testToken})
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	// Stop while the finish is being carried out: the stream handlers wake
	// to their last event with the stop already there.
	srv.hooks.finishing = srv.halt
	ctx, stop := context.WithCancel(t.Context())
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ctx, lis) }()
	go func() { <-srv.Finished(); stop() }()

	addr := lis.Addr().String()
	a := join(t, newClient(t, addr), "host-a", "10.0.0.1", 1, 2222)
	b := join(t, newClient(t, addr), "host-b", "10.0.0.2", 1, 1111)
	exit0 := func(context.Context, int64, *gotrainv1.RankAssignment) (int32, string, bool) { return 0, "", true }
	resA := runAgent(rpcCtx(t), a, exit0)
	resB := runAgent(rpcCtx(t), b, exit0)
	for host, res := range map[string]<-chan runResult{"host-a": resA, "host-b": resB} {
		got := <-res
		if got.err != nil || len(got.events) != 2 || got.events[1] != "finished succeeded=true exit=0" {
			t.Errorf("%s: events %q, err %v", host, got.events, got.err)
		}
	}
	if err := <-served; err != nil {
		t.Errorf("Serve = %v", err)
	}
}

func TestNewValidates(t *testing.T) {
	for _, cfg := range []Config{
		{Job: job.Config{RunID: "r"}}, // no token
		{Token: "t"},                  // no run id
		{Job: job.Config{RunID: "r", Nodes: -1}, Token: "t"},       // bad nodes
		{Job: job.Config{RunID: "r", MaxRestarts: -1}, Token: "t"}, // bad restarts
	} {
		if _, err := New(cfg); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("New(%+v) = %v, want ErrInvalidConfig", cfg, err)
		}
	}
}

// TestNewerWatchStreamWins: streams of one node that reach the coordinator
// out of order (one queued in a partition arrives after the one its agent
// opened since) never end the newer: a stale stream is refused, and a
// newer one supersedes the one served, which ends with ALREADY_EXISTS (a
// blip to the agent, never Aborted, which ends its contact); the node
// stays in the job throughout.
func TestNewerWatchStreamWins(t *testing.T) {
	srv, addr := startServer(t, Config{Job: job.Config{Nodes: 1, NodeTimeout: time.Hour}}, testHooks{})
	ctx := rpcCtx(t)
	a := join(t, newClient(t, addr), "host-a", "10.0.0.1", 1, 2222)
	open := func(n uint64) grpc.ServerStreamingClient[gotrainv1.GenerationEvent] {
		t.Helper()
		s, err := a.c.WatchGenerations(ctx, &gotrainv1.WatchGenerationsRequest{NodeId: a.id, Stream: n})
		if err != nil {
			t.Fatalf("watch stream %d: %v", n, err)
		}
		if ev, err := s.Recv(); err != nil || ev.GetStarted() == nil {
			t.Fatalf("watch stream %d: first event %v, %v; want started", n, ev, err)
		}
		return s
	}
	// In order: stream 2 supersedes stream 1.
	s1 := open(1)
	s2 := open(2)
	if _, err := s1.Recv(); status.Code(err) != codes.AlreadyExists || !strings.Contains(status.Convert(err).Message(), "superseded") {
		t.Errorf("stream 1 after stream 2 opened: %v; want AlreadyExists, superseded", err)
	}
	// Out of order: stream 3 first, then the late stream 2' (numbered 2
	// again, as if queued): refused, and stream 3 goes on.
	s3 := open(3)
	if _, err := s2.Recv(); status.Code(err) != codes.AlreadyExists {
		t.Errorf("stream 2 after stream 3 opened: %v; want AlreadyExists", err)
	}
	late, err := a.c.WatchGenerations(ctx, &gotrainv1.WatchGenerationsRequest{NodeId: a.id, Stream: 2})
	if err == nil {
		_, err = late.Recv()
	}
	if status.Code(err) != codes.AlreadyExists {
		t.Errorf("a late stream 2 while stream 3 is served: %v; want AlreadyExists", err)
	}
	// Stream 3 still gets the job's events: its end.
	if _, err := srv.ReportWorkerExit(ctx, &gotrainv1.ReportWorkerExitRequest{NodeId: a.id, Generation: 0, Rank: 0}); err != nil {
		t.Fatal(err)
	}
	for {
		ev, err := s3.Recv()
		if err != nil {
			t.Fatalf("stream 3 ended before the job's end: %v", err)
		}
		if ev.GetFinished() != nil {
			break
		}
	}
	if !srv.HasNode(a.id) && !srv.Result().GetSucceeded() {
		t.Errorf("the node was lost to the stream races: %v", srv.Result())
	}
}

// TestBlameOnceGossipAgrees: a node whose stream this coordinator lost
// while gossip still hears it is not named unreachable (a warning) — only
// an information line says so; once gossip finds it dead too, it is.
func TestBlameOnceGossipAgrees(t *testing.T) {
	logs := &testkit.Buffer{}
	// Set before Serve, which reads the logger unlocked.
	srv, addr := startBounded(t, Config{Job: job.Config{Nodes: 2, NodeTimeout: time.Hour}}, func(s *Server) {
		s.gossip = &gossipEvents{s: s, now: time.Now}
		s.log = slog.New(slog.NewTextHandler(logs, nil))
	})
	ctx := rpcCtx(t)
	a := join(t, newClient(t, addr), "host-a", "10.0.0.1", 1, 2222)
	b := join(t, newClient(t, addr), "host-b", "10.0.0.2", 1, 1111)
	as := a.watch(ctx)
	bctx, breakStream := context.WithCancel(ctx)
	bs := b.watch(bctx)
	for _, s := range []grpc.ServerStreamingClient[gotrainv1.GenerationEvent]{as, bs} {
		if ev, err := s.Recv(); err != nil || ev.GetStarted() == nil {
			t.Fatalf("first event = %v, %v; want started", ev, err)
		}
	}
	breakStream()
	logged := func(what string) bool {
		return strings.Contains(logs.String(), what)
	}
	testkit.WaitFor(t, rpcTimeout, "the out-of-contact line", func() bool {
		return logged(`msg="node out of contact with this coordinator; its peers still hear it" node_id=` + b.id)
	})
	if logged(`msg="node unreachable"`) {
		t.Errorf("host-b named unreachable while gossip still hears it")
	}
	srv.gossipSays(b.id, true, "gossip: no answer")
	testkit.WaitFor(t, rpcTimeout, "the unreachable warning", func() bool { return logged(`level=WARN msg="node unreachable" node_id=` + b.id) })
}

// TestJoinRetriedIsOneNode: an agent whose Join answer was lost (a leader
// change after the commit) joins again with the same request: it gets the
// same node id, and a job at its size does not refuse it; another agent
// (another pid) on the same host is another node.
func TestJoinRetriedIsOneNode(t *testing.T) {
	srv, addr := startServer(t, Config{Job: job.Config{Nodes: 2, NodeTimeout: time.Hour}}, testHooks{})
	c := newClient(t, addr)
	req := &gotrainv1.JoinRequest{Node: &gotrainv1.NodeInfo{Hostname: "host-a", Address: "10.0.0.1", Nproc: 1, AgentPid: 4000, FreePort: 2222}}
	first, err := c.Join(rpcCtx(t), req)
	if err != nil {
		t.Fatal(err)
	}
	again, err := c.Join(rpcCtx(t), req)
	if err != nil || again.GetNodeId() != first.GetNodeId() {
		t.Fatalf("the same Join again: %v, %v; want node %s again", again.GetNodeId(), err, first.GetNodeId())
	}
	other := proto.CloneOf(req)
	other.Node.AgentPid = 4001
	second, err := c.Join(rpcCtx(t), other)
	if err != nil || second.GetNodeId() == first.GetNodeId() {
		t.Fatalf("another agent on host-a: %v, %v; want a node of its own", second.GetNodeId(), err)
	}
	if st, _ := srv.GetJobStatus(rpcCtx(t), &gotrainv1.GetJobStatusRequest{}); len(st.GetNodes()) != 2 {
		t.Errorf("the job has %d nodes, want 2", len(st.GetNodes()))
	}
}
