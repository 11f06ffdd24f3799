package coordinator

import (
	"context"
	"errors"
	"fmt"
	"github.com/gotrain/gotrain/internal/coordinator/job"
	"go.uber.org/goleak"
	"io"
	"log/slog"
	"net"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/gotrain/gotrain/internal/coordinator/kv"
	"github.com/gotrain/gotrain/internal/testing/testkit"
	"github.com/gotrain/gotrain/internal/token"
	gotrainv1 "github.com/gotrain/gotrain/proto/gotrain/v1"
)

// startBounded serves cfg on a loopback TCP port until the test ends, with
// setup run on the Server before it serves (smaller limits, hooks); the
// coordinator's log is shown when the test fails.
func startBounded(t *testing.T, cfg Config, setup func(*Server)) (*Server, string) {
	t.Helper()
	if cfg.Job.RunID == "" {
		cfg.Job.RunID = "run-test"
	}
	cfg.Token = testToken
	logs := &testkit.Buffer{}
	cfg.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	srv, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if setup != nil {
		setup(srv)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	before := goleak.IgnoreCurrent()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, lis) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
		goleak.VerifyNone(t, before)
		if t.Failed() {
			t.Logf("coordinator log:\n%s", logs.String())
		}
	})
	return srv, lis.Addr().String()
}

func cpuNode(host string, nproc int32) *gotrainv1.JoinRequest {
	return &gotrainv1.JoinRequest{Node: &gotrainv1.NodeInfo{Hostname: host, Address: "10.0.0.1", Nproc: nproc, AgentPid: 1, FreePort: 29500}}
}

func heapAfterGC() uint64 {
	var m runtime.MemStats
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// One Join with nproc 2^31-1 (or a typo in
// --nproc-per-node) ran the coordinator out of memory. Joins over
// MaxNprocPerNode are refused with a clear error, at once.
func TestJoinNprocBounded(t *testing.T) {
	_, addr := startBounded(t, Config{Job: job.Config{Nodes: 2}}, nil)
	c := newClient(t, addr)
	for _, nproc := range []int32{MaxNprocPerNode + 1, 1<<31 - 1} {
		before := heapAfterGC()
		start := time.Now()
		_, err := c.Join(rpcCtx(t), cpuNode(fmt.Sprintf("big-%d", nproc), nproc))
		wantCode(t, fmt.Sprintf("join with nproc %d", nproc), err, codes.InvalidArgument)
		if err != nil && !strings.Contains(err.Error(), "--nproc-per-node") {
			t.Errorf("the error does not say what to fix: %v", err)
		}
		if d, grew := time.Since(start), int64(heapAfterGC())-int64(before); d > 5*time.Second || grew > 16<<20 {
			t.Errorf("join with nproc %d took %v and %d bytes", nproc, d, grew)
		}
	}
	if _, err := c.Join(rpcCtx(t), cpuNode("ok", MaxNprocPerNode)); err != nil {
		t.Errorf("join with nproc %d: %v", MaxNprocPerNode, err)
	}
}

// A Join storm while the job waits for its nodes added
// ranks without bound. The job's ranks are bounded by MaxRanksPerJob.
func TestJoinRanksPerJobBounded(t *testing.T) {
	const nodes = MaxRanksPerJob / MaxNprocPerNode
	_, addr := startBounded(t, Config{Job: job.Config{Nodes: 10 * nodes}}, nil)
	c := newClient(t, addr)
	for i := range nodes {
		if _, err := c.Join(rpcCtx(t), cpuNode(fmt.Sprintf("n%d", i), MaxNprocPerNode)); err != nil {
			t.Fatalf("join %d: %v", i, err)
		}
	}
	_, err := c.Join(rpcCtx(t), cpuNode("one-too-many", 1))
	wantCode(t, "a join past the ranks per job", err, codes.ResourceExhausted)
}

// A KVGet of a missing key left ~191 B behind for good.
func TestKVGetMissingKeyLeavesNothing(t *testing.T) {
	_, addr := startBounded(t, Config{}, nil)
	c := newClient(t, addr)
	// Each call has its own deadline (20000 calls under one took longer on
	// a loaded machine), not rpcCtx: its cleanup would be held, on the heap,
	// until the test ends.
	get := func(i int) error {
		ctx, cancel := context.WithTimeout(t.Context(), rpcTimeout)
		defer cancel()
		_, err := c.KVGet(ctx, &gotrainv1.KVGetRequest{Key: fmt.Sprintf("missing/%08d", i), WaitMs: 1})
		return err
	}
	for i := range 200 { // warm up connections and pools
		if err := get(i); err != nil {
			t.Fatal(err)
		}
	}
	const n = 20000
	before := heapAfterGC()
	var wg sync.WaitGroup
	errs := make([]error, 8)
	for w := range errs {
		wg.Go(func() {
			for i := w; i < n && errs[w] == nil; i += 8 {
				errs[w] = get(1000 + i)
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	grew := int64(heapAfterGC()) - int64(before)
	t.Logf("%d lookups of missing keys: heap grew by %d bytes (%d per lookup)", n, grew, grew/n)
	if grew > n*20 {
		t.Errorf("%d lookups of missing keys left %d bytes behind (%d per lookup)", n, grew, grew/n)
	}
}

// 2000 values of 256 KiB were all kept. Keys, values and
// the job's keys and bytes are bounded, with errors that say so.
func TestKVBounded(t *testing.T) {
	srv, addr := startBounded(t, Config{}, func(s *Server) {
		lim := kv.DefaultLimits()
		lim.MaxBytes = 8 << 20
		s.st.SetKVLimits(lim)
	})
	c := newClient(t, addr)
	_, err := c.KVPut(rpcCtx(t), &gotrainv1.KVPutRequest{Key: strings.Repeat("k", 2<<10), Value: []byte("v")})
	wantCode(t, "a 2 KiB key", err, codes.InvalidArgument)
	_, err = c.KVGet(rpcCtx(t), &gotrainv1.KVGetRequest{Key: strings.Repeat("k", 2<<10), WaitMs: 1})
	wantCode(t, "a wait for a 2 KiB key", err, codes.InvalidArgument)
	_, err = c.KVPut(rpcCtx(t), &gotrainv1.KVPutRequest{Key: "big", Value: make([]byte, 2<<20)})
	wantCode(t, "a 2 MiB value", err, codes.InvalidArgument)
	val := make([]byte, 256<<10)
	var puts int
	for puts = 0; puts < 2000; puts++ {
		if _, err = c.KVPut(rpcCtx(t), &gotrainv1.KVPutRequest{Key: fmt.Sprintf("flood/%d", puts), Value: val}); err != nil {
			break
		}
	}
	wantCode(t, fmt.Sprintf("put %d of 2000 values of 256 KiB", puts+1), err, codes.ResourceExhausted)
	if st := storeOf(srv, "").Stats(); st.Bytes > 8<<20 {
		t.Errorf("the store holds %d bytes, over its 8 MiB", st.Bytes)
	}
}

// A token holder who fills the job's KV store (a worker, through its
// agent's relay) made every later rendezvous fail with ResourceExhausted, so
// a job could not restart (the load test, internal/testing/integration TestLoad).
// Communicators' rendezvous keys have a store of their own.
func TestKVFloodLeavesRoomForRendezvous(t *testing.T) {
	_, addr := startBounded(t, Config{}, func(s *Server) {
		lim := kv.DefaultLimits()
		lim.MaxBytes = 1 << 20
		s.st.SetKVLimits(lim)
	})
	c := newClient(t, addr)
	var err error
	for i, size := 0, 64<<10; err == nil || size > 0; i++ {
		if err != nil {
			size /= 2
		}
		_, err = c.KVPut(rpcCtx(t), &gotrainv1.KVPutRequest{Key: fmt.Sprintf("flood/%d", i), Value: make([]byte, size)})
		if err != nil && status.Code(err) != codes.ResourceExhausted {
			t.Fatal(err)
		}
	}
	wantCode(t, "an empty value in a full store", err, codes.ResourceExhausted)
	for _, key := range []string{"cpucomm/world/1/addr/0", "ncclcomm/world/1/id"} {
		if _, err := c.KVPut(rpcCtx(t), &gotrainv1.KVPutRequest{Key: key, Value: []byte("127.0.0.1:29500")}); err != nil {
			t.Errorf("put %s after the flood: %v", key, err)
		}
		r, err := c.KVGet(rpcCtx(t), &gotrainv1.KVGetRequest{Key: key, WaitMs: 1000})
		if err != nil || !r.GetFound() || string(r.GetValue()) != "127.0.0.1:29500" {
			t.Errorf("get %s after the flood: %v %v", key, r, err)
		}
	}
}

// 10 000 streams on one connection were accepted. Calls on
// one connection beyond the limit wait for a stream (the client queues them).
func TestStreamsPerConnectionBounded(t *testing.T) {
	const limit = 8
	var waiting atomic.Int32
	srv, addr := startBounded(t, Config{}, func(s *Server) {
		s.limits.streamsPerConn = limit
		s.hooks.kvWaiting = func(string) { waiting.Add(1) }
	})
	c := newClient(t, addr)
	var wg sync.WaitGroup
	for range 3 * limit {
		wg.Go(func() {
			if _, err := c.KVGet(rpcCtx(t), &gotrainv1.KVGetRequest{Key: "later", WaitMs: 60_000}); err != nil {
				t.Error(err)
			}
		})
	}
	testkit.WaitFor(t, rpcTimeout, "calls waiting", func() bool { return waiting.Load() >= limit })
	time.Sleep(300 * time.Millisecond) // any call past the limit would arrive now
	if n := waiting.Load(); n != limit {
		t.Errorf("%d calls wait on one connection, want %d (the limit)", n, limit)
	}
	if _, err := srv.commit(&gotrainv1.LogEntry{Entry: &gotrainv1.LogEntry_KvPut{KvPut: &gotrainv1.KVPutRequest{Key: "later", Value: []byte("now")}}}); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
}

// Idle TCP connections to the coordinator's port stayed
// open for good and used up file descriptors. A connection that does not
// complete its handshake is closed within handshakeTimeout, one without a
// call in flight within its idle limit.
func TestIdleConnectionsClosed(t *testing.T) {
	_, addr := startBounded(t, Config{}, func(s *Server) { s.limits.connIdle = time.Second })
	raw, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	start := time.Now()
	_ = raw.SetReadDeadline(time.Now().Add(handshakeTimeout + 10*time.Second))
	_, err = io.Copy(io.Discard, raw)
	if d := time.Since(start); err != nil || d > handshakeTimeout+3*time.Second {
		t.Errorf("a silent TCP connection was closed after %v (%v), want within %v", d, err, handshakeTimeout)
	}

	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()), token.DialOption(testToken))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	if _, err := gotrainv1.NewCoordinatorClient(cc).GetJobStatus(rpcCtx(t), &gotrainv1.GetJobStatusRequest{}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	for s := cc.GetState(); s == connectivity.Ready; s = cc.GetState() {
		if !cc.WaitForStateChange(ctx, s) {
			t.Fatal("an idle gRPC connection stayed open 10 s past its 1 s idle limit")
		}
	}
}

// Evidence text was appended without bound. One report
// holds at most maxEvidencePerReport entries, each text is cut to
// maxEvidenceText, and the job keeps at most maxEvidenceBytes.
func TestEvidenceBounded(t *testing.T) {
	_, addr := startBounded(t, Config{}, nil)
	c := newClient(t, addr)
	many := &gotrainv1.ReportEvidenceRequest{NodeId: "node-1"}
	for range maxEvidencePerReport + 1 {
		many.Evidence = append(many.Evidence, &gotrainv1.Evidence{Kind: "stacks", Text: "x"})
	}
	_, err := c.ReportEvidence(rpcCtx(t), many)
	wantCode(t, fmt.Sprintf("evidence with %d entries", len(many.Evidence)), err, codes.InvalidArgument)

	s, err := New(Config{Job: job.Config{RunID: "r"}, Token: testToken})
	if err != nil {
		t.Fatal(err)
	}
	var kept int
	handler := func(_ context.Context, req any) (any, error) {
		for _, e := range req.(*gotrainv1.ReportEvidenceRequest).GetEvidence() {
			if len(e.GetText()) > maxEvidenceText {
				t.Fatalf("a handler got %d bytes of evidence text", len(e.GetText()))
			}
			kept += len(e.GetText())
		}
		return &gotrainv1.ReportEvidenceResponse{}, nil
	}
	big := strings.Repeat("é", maxEvidenceText) // 2 bytes a rune: cut mid-text
	for range 2 * maxEvidenceBytes / maxEvidenceText / 8 {
		req := &gotrainv1.ReportEvidenceRequest{}
		for range 8 {
			req.Evidence = append(req.Evidence, &gotrainv1.Evidence{Kind: "stacks", Text: big})
		}
		if _, err := s.bounds.check(t.Context(), req, nil, handler); err != nil {
			t.Fatal(err)
		}
		for _, e := range req.GetEvidence() {
			if !strings.HasSuffix(e.GetText(), cut) || !utf8Valid(e.GetText()) {
				t.Fatalf("cut text ends %q", e.GetText()[len(e.GetText())-40:])
			}
		}
	}
	if kept > maxEvidenceBytes || kept < maxEvidenceBytes/2 {
		t.Errorf("the job kept %d bytes of evidence, want at most %d (and most of it)", kept, maxEvidenceBytes)
	}
}

func utf8Valid(s string) bool { return strings.ToValidUTF8(s, "\uFFFD") == s }

var _ = errors.Is

// storeOf is the KV store of srv that holds key.
func storeOf(srv *Server, key string) *kv.Store {
	srv.mu.Lock()
	defer srv.mu.Unlock()
	return srv.st.Store(key)
}
