package leaderconn_test

import (
	"context"
	"errors"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/gotrain/gotrain/internal/leaderconn"
	gotrainv1 "github.com/gotrain/gotrain/proto/gotrain/v1"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// cluster is who the test's replicas think leads.
type cluster struct {
	mu     sync.Mutex
	leader string // "" while none does
	hint   bool   // followers name the leader
}

func (c *cluster) set(leader string, hint bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.leader, c.hint = leader, hint
}

func (c *cluster) get() (string, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.leader, c.hint
}

// replica is a coordinator replica: a follower answers NotLeader, the
// leader answers GetJobStatus with its address as the run id.
type replica struct {
	gotrainv1.UnimplementedCoordinatorServer
	c       *cluster
	addr    string
	srv     *grpc.Server
	calls   atomic.Int32
	watched atomic.Value // the node id of the last WatchGenerations the leader served
	// stepDownTo, when set, is the leader a leader names after sending a
	// watch stream's first event.
	stepDownTo atomic.Value
	// hung is a partitioned replica: its handlers never answer.
	hung atomic.Bool
	// holdBarrier has the leader's Barrier wait (for ranks that never
	// come), after a send on inBarrier.
	holdBarrier atomic.Bool
	inBarrier   chan struct{}
	barriers    atomic.Int32 // Barrier calls the leader served
	kvGets      atomic.Int32 // KVGet calls the leader served
}

func (r *replica) check(ctx context.Context) error {
	r.calls.Add(1)
	if r.hung.Load() {
		<-ctx.Done()
		return status.FromContextError(ctx.Err()).Err()
	}
	leader, hint := r.c.get()
	if leader == r.addr {
		return nil
	}
	if !hint {
		leader = ""
	}
	return leaderconn.NotLeader(ctx, r.addr, leader)
}

func (r *replica) GetJobStatus(ctx context.Context, _ *gotrainv1.GetJobStatusRequest) (*gotrainv1.JobStatus, error) {
	if err := r.check(ctx); err != nil {
		return nil, err
	}
	return &gotrainv1.JobStatus{RunId: r.addr}, nil
}

func (r *replica) Diagnose(ctx context.Context, _ *gotrainv1.DiagnoseRequest) (*gotrainv1.DiagnoseResponse, error) {
	if err := r.check(ctx); err != nil {
		return nil, err
	}
	return nil, status.Error(codes.FailedPrecondition, "the job has not started")
}

func (r *replica) ReportProgress(ctx context.Context, _ *gotrainv1.ReportProgressRequest) (*gotrainv1.ReportProgressResponse, error) {
	if err := r.check(ctx); err != nil {
		return nil, err
	}
	return &gotrainv1.ReportProgressResponse{}, nil
}

// KVGet waits wait_ms and answers with the leader's address as the value.
func (r *replica) KVGet(ctx context.Context, req *gotrainv1.KVGetRequest) (*gotrainv1.KVGetResponse, error) {
	if err := r.check(ctx); err != nil {
		return nil, err
	}
	r.kvGets.Add(1)
	t := time.NewTimer(time.Duration(req.GetWaitMs()) * time.Millisecond)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return nil, status.FromContextError(ctx.Err()).Err()
	case <-t.C:
	}
	return &gotrainv1.KVGetResponse{Found: true, Value: []byte(r.addr)}, nil
}

// Barrier answers at once, with the leader's address in the header
// "replica", unless holdBarrier is set.
func (r *replica) Barrier(ctx context.Context, _ *gotrainv1.BarrierRequest) (*gotrainv1.BarrierResponse, error) {
	if err := r.check(ctx); err != nil {
		return nil, err
	}
	r.barriers.Add(1)
	if r.holdBarrier.Load() {
		r.inBarrier <- struct{}{}
		<-ctx.Done()
		return nil, status.FromContextError(ctx.Err()).Err()
	}
	_ = grpc.SetHeader(ctx, metadata.Pairs("replica", r.addr))
	return &gotrainv1.BarrierResponse{}, nil
}

func (r *replica) WatchGenerations(req *gotrainv1.WatchGenerationsRequest, s grpc.ServerStreamingServer[gotrainv1.GenerationEvent]) error {
	ctx := s.Context()
	if err := r.check(ctx); err != nil {
		return err
	}
	r.watched.Store(req.GetNodeId())
	ev := &gotrainv1.GenerationEvent{Event: &gotrainv1.GenerationEvent_Started{Started: &gotrainv1.GenerationStarted{Generation: 1, MasterAddr: r.addr}}}
	if err := s.Send(ev); err != nil {
		return err
	}
	if to, _ := r.stepDownTo.Load().(string); to != "" {
		return leaderconn.NotLeader(ctx, r.addr, to)
	}
	<-ctx.Done()
	return nil
}

// startReplicas starts n replicas of c on 127.0.0.1, stopped when the test
// ends.
func startReplicas(t *testing.T, c *cluster, n int) []*replica {
	t.Helper()
	var rs []*replica
	for range n {
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		r := &replica{c: c, addr: lis.Addr().String(), srv: grpc.NewServer(), inBarrier: make(chan struct{}, 16)}
		gotrainv1.RegisterCoordinatorServer(r.srv, r)
		done := make(chan struct{})
		go func() { defer close(done); _ = r.srv.Serve(lis) }()
		t.Cleanup(func() { r.srv.Stop(); <-done })
		rs = append(rs, r)
	}
	return rs
}

func addrs(rs ...*replica) []string {
	var as []string
	for _, r := range rs {
		as = append(as, r.addr)
	}
	return as
}

func dial(addr string) (*grpc.ClientConn, error) {
	return grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
}

// switches records the Conn's switches.
type switches struct {
	mu sync.Mutex
	to []string
}

func (s *switches) record(_, to, _ string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.to = append(s.to, to)
}

func (s *switches) get() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.to)
}

func newConn(t *testing.T, as []string, opts ...leaderconn.Option) (*leaderconn.Conn, gotrainv1.CoordinatorClient) {
	t.Helper()
	lc, err := leaderconn.New(as, dial, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lc.Close() })
	return lc, gotrainv1.NewCoordinatorClient(lc)
}

func status1(t *testing.T, client gotrainv1.CoordinatorClient) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	st, err := client.GetJobStatus(ctx, &gotrainv1.GetJobStatusRequest{})
	if err != nil {
		t.Fatalf("GetJobStatus: %v", err)
	}
	return st.GetRunId()
}

func TestNotLeaderTrailer(t *testing.T) {
	for _, tc := range []struct {
		name, leader, msg string
	}{
		{"known", "10.0.0.3:29400", "is not the leader; the leader is at 10.0.0.3:29400"},
		{"election", "", "is not the leader; no leader is known yet (an election is in progress)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := &cluster{}
			rs := startReplicas(t, c, 1)
			c.set(tc.leader, true)
			cc, err := dial(rs[0].addr)
			if err != nil {
				t.Fatal(err)
			}
			defer cc.Close()
			var md metadata.MD
			_, err = gotrainv1.NewCoordinatorClient(cc).GetJobStatus(t.Context(), &gotrainv1.GetJobStatusRequest{}, grpc.Trailer(&md))
			want := "coordinator replica " + rs[0].addr + " " + tc.msg
			if s, _ := status.FromError(err); s.Code() != codes.Unavailable || s.Message() != want {
				t.Errorf("err = %v, want Unavailable %q", err, want)
			}
			if got := md.Get(leaderconn.LeaderKey); !slices.Equal(got, nonEmpty(tc.leader)) {
				t.Errorf("trailer %s = %q, want %q", leaderconn.LeaderKey, got, nonEmpty(tc.leader))
			}
		})
	}
}

func nonEmpty(s string) []string {
	if s == "" {
		return nil
	}
	return []string{s}
}

// A follower names the leader, whom the Conn did not know: the call goes
// there at once, without trying the other replica.
func TestUnaryRedirect(t *testing.T) {
	c := &cluster{}
	rs := startReplicas(t, c, 3)
	f, other, l := rs[0], rs[1], rs[2]
	c.set(l.addr, true)
	var sw switches
	lc, client := newConn(t, addrs(f, other), leaderconn.WithOnSwitch(sw.record))
	if got := status1(t, client); got != l.addr {
		t.Errorf("answered by %s, want the leader %s", got, l.addr)
	}
	if f.calls.Load() != 1 || other.calls.Load() != 0 || l.calls.Load() != 1 {
		t.Errorf("calls follower %d, other %d, leader %d; want 1, 0, 1", f.calls.Load(), other.calls.Load(), l.calls.Load())
	}
	if lc.Leader() != l.addr || !slices.Equal(lc.Addrs(), addrs(f, other, l)) {
		t.Errorf("Leader %s, Addrs %v; want %s, %v", lc.Leader(), lc.Addrs(), l.addr, addrs(f, other, l))
	}
	if got := sw.get(); !slices.Equal(got, []string{l.addr}) {
		t.Errorf("switches to %v, want [%s]", got, l.addr)
	}
	// Later calls go straight to the leader.
	status1(t, client)
	if f.calls.Load() != 1 || l.calls.Load() != 2 {
		t.Errorf("second call: follower %d, leader %d calls; want 1, 2", f.calls.Load(), l.calls.Load())
	}
}

// No replica knows the leader yet (an election): the Conn tries each in
// turn until the leader answers.
func TestUnknownLeaderRoundRobin(t *testing.T) {
	c := &cluster{}
	rs := startReplicas(t, c, 3)
	c.set(rs[2].addr, false)
	lc, client := newConn(t, addrs(rs...))
	if got := status1(t, client); got != rs[2].addr {
		t.Errorf("answered by %s, want %s", got, rs[2].addr)
	}
	if lc.Leader() != rs[2].addr {
		t.Errorf("Leader = %s, want %s", lc.Leader(), rs[2].addr)
	}
	for i, r := range rs {
		if r.calls.Load() != 1 {
			t.Errorf("replica %d had %d calls, want 1", i, r.calls.Load())
		}
	}
}

// The leader's server dies; another replica becomes leader: calls go on.
func TestLeaderKilled(t *testing.T) {
	c := &cluster{}
	rs := startReplicas(t, c, 3)
	c.set(rs[0].addr, true)
	var sw switches
	lc, client := newConn(t, addrs(rs...), leaderconn.WithOnSwitch(sw.record))
	if got := status1(t, client); got != rs[0].addr {
		t.Fatalf("answered by %s, want %s", got, rs[0].addr)
	}
	rs[0].srv.Stop()
	c.set(rs[2].addr, true)
	if got := status1(t, client); got != rs[2].addr {
		t.Errorf("after the leader died: answered by %s, want %s", got, rs[2].addr)
	}
	if lc.Leader() != rs[2].addr {
		t.Errorf("Leader = %s, want %s", lc.Leader(), rs[2].addr)
	}
	// Round robin reached rs[1], which pointed at rs[2].
	if got := sw.get(); !slices.Equal(got, []string{rs[1].addr, rs[2].addr}) {
		t.Errorf("switches to %v, want %v", got, addrs(rs[1], rs[2]))
	}
}

// Calls from many goroutines while the leader moves all succeed.
func TestConcurrentCallsWhileLeaderMoves(t *testing.T) {
	c := &cluster{}
	rs := startReplicas(t, c, 3)
	c.set(rs[0].addr, true)
	_, client := newConn(t, addrs(rs...))
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-time.After(2 * time.Millisecond):
			}
			c.set(rs[i%3].addr, i%2 == 0)
		}
	})
	var calls sync.WaitGroup
	for range 16 {
		calls.Go(func() {
			for range 20 {
				ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
				_, err := client.GetJobStatus(ctx, &gotrainv1.GetJobStatusRequest{})
				cancel()
				if err != nil {
					t.Errorf("GetJobStatus: %v", err)
					return
				}
			}
		})
	}
	calls.Wait()
	close(stop)
	wg.Wait()
}

// The caller's deadline ends the search for a leader.
func TestDeadlineRespected(t *testing.T) {
	c := &cluster{}
	rs := startReplicas(t, c, 2)
	_, client := newConn(t, addrs(rs...)) // no leader; the default 15 s window
	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := client.GetJobStatus(ctx, &gotrainv1.GetJobStatusRequest{})
	if err == nil {
		t.Fatal("GetJobStatus succeeded without a leader")
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("returned after %v, the deadline was 200ms", d)
	}
	if code := status.Code(err); code != codes.Unavailable && code != codes.DeadlineExceeded {
		t.Errorf("err = %v, want Unavailable or DeadlineExceeded", err)
	}
}

// Past the failover window the last Unavailable comes back unchanged.
func TestWindowExceeded(t *testing.T) {
	c := &cluster{}
	rs := startReplicas(t, c, 2)
	_, client := newConn(t, addrs(rs...), leaderconn.WithFailoverWindow(300*time.Millisecond))
	start := time.Now()
	_, err := client.GetJobStatus(t.Context(), &gotrainv1.GetJobStatusRequest{})
	d := time.Since(start)
	s, _ := status.FromError(err)
	if s.Code() != codes.Unavailable || !strings.Contains(s.Message(), "no leader is known yet") {
		t.Errorf("err = %v, want a replica's Unavailable", err)
	}
	if d < 300*time.Millisecond || d > 2*time.Second {
		t.Errorf("returned after %v, want about the 300ms window", d)
	}
	if n := rs[0].calls.Load() + rs[1].calls.Load(); n < 4 {
		t.Errorf("%d calls in the window, want at least 4 (backoff from 25ms)", n)
	}
}

// Errors other than Unavailable return at once.
func TestOtherErrorsNotRetried(t *testing.T) {
	c := &cluster{}
	rs := startReplicas(t, c, 2)
	c.set(rs[0].addr, true)
	_, client := newConn(t, addrs(rs...))
	_, err := client.Diagnose(t.Context(), &gotrainv1.DiagnoseRequest{})
	if status.Code(err) != codes.FailedPrecondition {
		t.Errorf("err = %v, want FailedPrecondition", err)
	}
	if rs[0].calls.Load() != 1 || rs[1].calls.Load() != 0 {
		t.Errorf("calls %d, %d; want 1, 0", rs[0].calls.Load(), rs[1].calls.Load())
	}
}

// A canceled context is not retried, even against a follower.
func TestCanceledNotRetried(t *testing.T) {
	c := &cluster{}
	rs := startReplicas(t, c, 2)
	_, client := newConn(t, addrs(rs...))
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	_, err := client.GetJobStatus(ctx, &gotrainv1.GetJobStatusRequest{})
	if status.Code(err) != codes.Canceled {
		t.Errorf("err = %v, want Canceled", err)
	}
	if n := rs[0].calls.Load() + rs[1].calls.Load(); n != 0 {
		t.Errorf("%d calls reached a replica, want 0", n)
	}
}

// A watch opened on a follower is opened again on the leader, with the
// request replayed; with or without a hint.
func TestWatchOpenedOnFollowerReopensOnLeader(t *testing.T) {
	for _, hint := range []bool{true, false} {
		t.Run(map[bool]string{true: "hint", false: "election"}[hint], func(t *testing.T) {
			c := &cluster{}
			rs := startReplicas(t, c, 3)
			l := rs[2]
			c.set(l.addr, hint)
			as := addrs(rs[0], rs[1])
			if !hint {
				as = addrs(rs...)
			}
			lc, client := newConn(t, as)
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			w, err := client.WatchGenerations(ctx, &gotrainv1.WatchGenerationsRequest{NodeId: "node-7"})
			if err != nil {
				t.Fatal(err)
			}
			ev, err := w.Recv()
			if err != nil {
				t.Fatalf("Recv: %v", err)
			}
			if got := ev.GetStarted().GetMasterAddr(); got != l.addr {
				t.Errorf("event from %s, want the leader %s", got, l.addr)
			}
			if got, _ := l.watched.Load().(string); got != "node-7" {
				t.Errorf("the leader watched for %q, want the replayed node-7", got)
			}
			if lc.Leader() != l.addr {
				t.Errorf("Leader = %s, want %s", lc.Leader(), l.addr)
			}
			want := map[bool]int32{true: 0, false: 1}[hint]
			if rs[1].calls.Load() != want {
				t.Errorf("the other follower had %d calls, want %d", rs[1].calls.Load(), want)
			}
		})
	}
}

// Once a message has arrived, a stream's error goes to the caller, and
// the Conn's next call goes to the leader the error named.
func TestWatchErrorAfterMessagePassedThrough(t *testing.T) {
	c := &cluster{}
	rs := startReplicas(t, c, 3)
	c.set(rs[0].addr, true)
	// rs[2], not rs[1] where round robin would go.
	rs[0].stepDownTo.Store(rs[2].addr)
	lc, client := newConn(t, addrs(rs...))
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	w, err := client.WatchGenerations(ctx, &gotrainv1.WatchGenerationsRequest{NodeId: "node-1"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Recv(); err != nil {
		t.Fatalf("first Recv: %v", err)
	}
	_, err = w.Recv()
	if s, _ := status.FromError(err); s.Code() != codes.Unavailable || !strings.Contains(s.Message(), "the leader is at "+rs[2].addr) {
		t.Errorf("second Recv: %v, want the replica's Unavailable", err)
	}
	if lc.Leader() != rs[2].addr {
		t.Errorf("Leader = %s, want %s", lc.Leader(), rs[2].addr)
	}
	if n := rs[1].calls.Load() + rs[2].calls.Load(); n != 0 {
		t.Errorf("the stream was reopened (%d calls on other replicas)", n)
	}
}

// A watch whose first replica is down (NewStream or the first Recv fails
// without a trailer) is opened on the next one.
func TestWatchFirstReplicaDown(t *testing.T) {
	c := &cluster{}
	rs := startReplicas(t, c, 2)
	rs[0].srv.Stop()
	c.set(rs[1].addr, true)
	lc, client := newConn(t, addrs(rs...))
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	w, err := client.WatchGenerations(ctx, &gotrainv1.WatchGenerationsRequest{NodeId: "node-3"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Recv(); err != nil {
		t.Fatalf("Recv: %v", err)
	}
	if got, _ := rs[1].watched.Load().(string); got != "node-3" || lc.Leader() != rs[1].addr {
		t.Errorf("watched %q on %s, want node-3 on %s", got, lc.Leader(), rs[1].addr)
	}
}

func TestSetAddrs(t *testing.T) {
	lc, err := leaderconn.New([]string{"a:1", "b:1", "a:1"}, dial)
	if err != nil {
		t.Fatal(err)
	}
	defer lc.Close()
	lc.SetAddrs([]string{"c:1", "b:1", "", "d:1"})
	if got, want := lc.Addrs(), []string{"a:1", "b:1", "c:1", "d:1"}; !slices.Equal(got, want) {
		t.Errorf("Addrs = %v, want %v", got, want)
	}
	if lc.Leader() != "a:1" {
		t.Errorf("Leader = %s, want a:1", lc.Leader())
	}
	if _, err := leaderconn.New(nil, dial); err == nil {
		t.Error("New without addresses succeeded")
	}
}

func TestClosed(t *testing.T) {
	c := &cluster{}
	rs := startReplicas(t, c, 1)
	c.set(rs[0].addr, true)
	lc, client := newConn(t, addrs(rs...))
	status1(t, client)
	if err := lc.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := client.GetJobStatus(t.Context(), &gotrainv1.GetJobStatusRequest{}); !errors.Is(err, leaderconn.ErrClosed) {
		t.Errorf("after Close: %v, want ErrClosed", err)
	}
}

// blackhole is the address of a partitioned host: it accepts TCP
// connections and never sends a byte.
func blackhole(t *testing.T) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var conns []net.Conn
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			conns = append(conns, c)
		}
	}()
	t.Cleanup(func() {
		_ = lis.Close()
		<-done
		for _, c := range conns {
			_ = c.Close()
		}
	})
	return lis.Addr().String()
}

const reportProgress = gotrainv1.Coordinator_ReportProgress_FullMethodName

func heartbeat(t *testing.T, client gotrainv1.CoordinatorClient) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if _, err := client.ReportProgress(ctx, &gotrainv1.ReportProgressRequest{NodeId: "node-1"}); err != nil {
		t.Fatalf("ReportProgress: %v", err)
	}
}

// wait is what ch delivers, failing the test if it takes over 10 s (a
// hang, not a slow machine).
func wait[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: still waiting after 10s", what)
		panic("unreachable")
	}
}

// The first replica is partitioned away: the heartbeat's attempt there
// times out, the next replica names the leader, and the heartbeat
// succeeds there.
func TestProbeTimeoutMovesOn(t *testing.T) {
	c := &cluster{}
	rs := startReplicas(t, c, 2)
	f, l := rs[0], rs[1]
	c.set(l.addr, true)
	hole := blackhole(t)
	var sw switches
	// The probe's timeout must pass at the hole and never at a replica
	// that answers: 200 ms was seen to pass at a live one under the race
	// detector on a loaded machine, and the attempt moved on from it.
	lc, client := newConn(t, []string{hole, f.addr},
		leaderconn.WithProbe(reportProgress, 2*time.Second), leaderconn.WithOnSwitch(sw.record))
	heartbeat(t, client)
	if lc.Leader() != l.addr {
		t.Errorf("Leader = %s, want %s", lc.Leader(), l.addr)
	}
	if f.calls.Load() != 1 || l.calls.Load() != 1 {
		t.Errorf("calls follower %d, leader %d; want 1, 1", f.calls.Load(), l.calls.Load())
	}
	if got := sw.get(); !slices.Equal(got, addrs(f, l)) {
		t.Errorf("switches to %v, want %v", got, addrs(f, l))
	}
	// What each said: the timeout is the network's, not a replica's answer.
	got := lc.Replicas()
	want := []leaderconn.Heard{leaderconn.Unreachable, leaderconn.NamesLeader, leaderconn.Answers}
	for i, r := range got {
		if r.Heard != want[i] {
			t.Errorf("%s: heard %v (%v), want %v", r.Addr, r.Heard, r.Err, want[i])
		}
	}
}

// With one replica known there is nowhere else to go: the probe's
// timeout does not apply, and the caller's deadline ends the one attempt.
func TestProbeNeedsAnotherReplica(t *testing.T) {
	c := &cluster{}
	rs := startReplicas(t, c, 1)
	c.set(rs[0].addr, true)
	rs[0].hung.Store(true)
	_, client := newConn(t, addrs(rs...), leaderconn.WithProbe(reportProgress, 20*time.Millisecond))
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	_, err := client.ReportProgress(ctx, &gotrainv1.ReportProgressRequest{})
	if status.Code(err) != codes.DeadlineExceeded {
		t.Errorf("err = %v, want DeadlineExceeded", err)
	}
	if n := rs[0].calls.Load(); n != 1 {
		t.Errorf("%d attempts, want 1", n)
	}
}

// A Barrier waits on the leader when the leader is partitioned away and
// another is elected; the heartbeat finds out, and the Barrier is sent
// again, to the new leader, whose answer the caller gets.
func TestCallInFlightMovesWithLeader(t *testing.T) {
	c := &cluster{}
	rs := startReplicas(t, c, 3)
	old, f, nl := rs[0], rs[1], rs[2]
	c.set(old.addr, true)
	old.holdBarrier.Store(true)
	var sw switches
	_, client := newConn(t, addrs(rs...),
		leaderconn.WithProbe(reportProgress, 200*time.Millisecond), leaderconn.WithOnSwitch(sw.record))
	type result struct {
		md  metadata.MD
		err error
	}
	done := make(chan result, 1)
	go func() {
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		defer cancel()
		var md metadata.MD
		_, err := client.Barrier(ctx, &gotrainv1.BarrierRequest{Name: "init", Generation: 1}, grpc.Header(&md))
		done <- result{md, err}
	}()
	wait(t, old.inBarrier, "the Barrier on the old leader")
	old.hung.Store(true)
	c.set(nl.addr, true)
	heartbeat(t, client)
	r := wait(t, done, "the Barrier")
	if r.err != nil {
		t.Fatalf("Barrier: %v", r.err)
	}
	if got := r.md.Get("replica"); !slices.Equal(got, []string{nl.addr}) {
		t.Errorf("Barrier answered by %v, want the new leader %s", got, nl.addr)
	}
	if old.barriers.Load() != 1 || nl.barriers.Load() != 1 {
		t.Errorf("Barrier calls old %d, new %d; want 1, 1", old.barriers.Load(), nl.barriers.Load())
	}
	if got := sw.get(); !slices.Equal(got, addrs(f, nl)) {
		t.Errorf("switches to %v, want %v", got, addrs(f, nl))
	}
}

// A watch that has had events from the old leader ends with Unavailable
// when the leader moves; the caller's new watch goes to the new leader.
func TestWatchEndsWhenLeaderMoves(t *testing.T) {
	c := &cluster{}
	rs := startReplicas(t, c, 3)
	old, f, nl := rs[0], rs[1], rs[2]
	c.set(old.addr, true)
	_, client := newConn(t, addrs(rs...), leaderconn.WithProbe(reportProgress, 200*time.Millisecond))
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	w, err := client.WatchGenerations(ctx, &gotrainv1.WatchGenerationsRequest{NodeId: "node-1"})
	if err != nil {
		t.Fatal(err)
	}
	if ev, err := w.Recv(); err != nil || ev.GetStarted().GetMasterAddr() != old.addr {
		t.Fatalf("first Recv: %v, %v; want the old leader's event", ev, err)
	}
	recv := make(chan error, 1)
	go func() { _, err := w.Recv(); recv <- err }()
	old.hung.Store(true)
	c.set(nl.addr, true)
	heartbeat(t, client)
	err = wait(t, recv, "the watch's Recv")
	if s, _ := status.FromError(err); s.Code() != codes.Unavailable || !strings.Contains(s.Message(), "leader moved to "+f.addr) {
		t.Errorf("Recv after the move: %v, want Unavailable: the leader moved to %s", err, f.addr)
	}
	w2, err := client.WatchGenerations(ctx, &gotrainv1.WatchGenerationsRequest{NodeId: "node-1"})
	if err != nil {
		t.Fatal(err)
	}
	if ev, err := w2.Recv(); err != nil || ev.GetStarted().GetMasterAddr() != nl.addr {
		t.Errorf("new watch: %v, %v; want the new leader's event", ev, err)
	}
}

// A watch opened on a leader that is partitioned away before it sent
// anything is opened again on the new leader when the heartbeat finds
// out; the caller sees only the new leader's event.
func TestWatchWithoutEventsFollowsLeader(t *testing.T) {
	c := &cluster{}
	rs := startReplicas(t, c, 3)
	old, nl := rs[0], rs[2]
	c.set(nl.addr, true)
	old.hung.Store(true)
	_, client := newConn(t, addrs(rs...), leaderconn.WithProbe(reportProgress, 200*time.Millisecond))
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	w, err := client.WatchGenerations(ctx, &gotrainv1.WatchGenerationsRequest{NodeId: "node-2"})
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		ev  *gotrainv1.GenerationEvent
		err error
	}
	recv := make(chan result, 1)
	go func() { ev, err := w.Recv(); recv <- result{ev, err} }()
	heartbeat(t, client)
	r := wait(t, recv, "the watch's Recv")
	if r.err != nil || r.ev.GetStarted().GetMasterAddr() != nl.addr {
		t.Errorf("Recv: %v, %v; want the new leader's event", r.ev, r.err)
	}
	if got, _ := nl.watched.Load().(string); got != "node-2" {
		t.Errorf("the new leader watched for %q, want the replayed node-2", got)
	}
}

// A long poll on a healthy leader outlives the probe's timeout, and
// heartbeats meanwhile leave it alone.
func TestLongCallNotCutByProbe(t *testing.T) {
	c := &cluster{}
	rs := startReplicas(t, c, 2)
	l := rs[0]
	c.set(l.addr, true)
	lc, client := newConn(t, addrs(rs...), leaderconn.WithProbe(reportProgress, 300*time.Millisecond))
	done := make(chan struct{})
	var beats sync.WaitGroup
	beats.Go(func() {
		for {
			select {
			case <-done:
				return
			case <-time.After(100 * time.Millisecond):
			}
			heartbeat(t, client)
		}
	})
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	resp, err := client.KVGet(ctx, &gotrainv1.KVGetRequest{Key: "k", WaitMs: 2000})
	close(done)
	beats.Wait()
	if err != nil || string(resp.GetValue()) != l.addr {
		t.Fatalf("KVGet: %v, %v; want the leader's answer", resp, err)
	}
	if l.kvGets.Load() != 1 || rs[1].calls.Load() != 0 || lc.Leader() != l.addr {
		t.Errorf("KVGet calls %d, calls to the follower %d, Leader %s; want 1, 0, %s", l.kvGets.Load(), rs[1].calls.Load(), lc.Leader(), l.addr)
	}
}

// A replica whose probe got no answer is dialled anew on the next call
// there: after a partition heals, its old connection may stay silent for
// seconds (TCP's backed-off retransmissions), a new one answers at once.
func TestProbeTimeoutRedials(t *testing.T) {
	c := &cluster{}
	rs := startReplicas(t, c, 2)
	l := rs[0]
	c.set(l.addr, true)
	var mu sync.Mutex
	dials := map[string]int{}
	lc, err := leaderconn.New(addrs(rs...), func(addr string) (*grpc.ClientConn, error) {
		mu.Lock()
		dials[addr]++
		mu.Unlock()
		return dial(addr)
	}, leaderconn.WithProbe(reportProgress, 200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lc.Close() })
	client := gotrainv1.NewCoordinatorClient(lc)
	heartbeat(t, client)
	l.hung.Store(true) // the leader goes silent, then comes back
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	_, _ = client.ReportProgress(ctx, &gotrainv1.ReportProgressRequest{}) // times out there, moves on to the other, which names l
	cancel()
	l.hung.Store(false)
	heartbeat(t, client)
	mu.Lock()
	defer mu.Unlock()
	if dials[l.addr] < 2 {
		t.Errorf("the silent leader %s was dialled %d times, want again after its probe timed out (dials %v)", l.addr, dials[l.addr], dials)
	}
}
