package host

import (
	"context"
	"crypto/tls"
	"io"
	"math/rand/v2"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/gotrain/gotrain/internal/jobtls"
	"github.com/gotrain/gotrain/internal/leaderconn"
	"github.com/gotrain/gotrain/internal/token"
	gotrainv1 "github.com/gotrain/gotrain/proto/gotrain/v1"
)

// replicaToken is the replicated tests' job token.
const replicaToken = "replicated-test-token-0123456789"

// freeReplicaAddrs returns n addresses on 127.0.0.1 whose port, port + 1
// (gossip) and port + 3 (Raft) were free a moment ago.
func freeReplicaAddrs(t *testing.T, n int) []string {
	t.Helper()
	var out []string
	used := map[int]bool{} // the ports of the replicas picked: gRPC, gossip (+1), Raft (+3)
	for len(out) < n {
		// Below the kernel's ephemeral range (32768 and up by default):
		// the ports are free when probed and bound only later, by the
		// replica, and a port from that range can meanwhile go to any
		// other test's connection or :0 listener (seen in CI: "bind:
		// address already in use"). Below it, only another caller of
		// a helper like this one can take them.
		p := 10000 + rand.IntN(22000)
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
		if err != nil {
			continue
		}
		ok := !used[p] && !used[p+1] && !used[p+3]
		var held []io.Closer
		for _, q := range []int{p + 1, p + 3} {
			if !ok {
				break
			}
			lq, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(q)))
			if ok = err == nil; ok {
				held = append(held, lq)
			}
		}
		for _, h := range held {
			h.Close()
		}
		l.Close()
		if ok {
			used[p], used[p+1], used[p+3] = true, true, true
			out = append(out, net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
		}
	}
	return out
}

// startReplicas starts a standalone replica set of n; opts change each
// replica's Config.
func startReplicas(t *testing.T, n int, nodes int, opts ...func(*Config)) (peers []string, cs []*Coordinator) {
	t.Helper()
	peers = freeReplicaAddrs(t, n)
	for _, p := range peers {
		cfg := DefaultConfig()
		cfg.JobToken, cfg.Listen, cfg.Peers, cfg.Nodes, cfg.MinNodes, cfg.NoGossip = replicaToken, p, peers, nodes, nodes, true
		cfg.MaxRestarts = 0
		for _, o := range opts {
			o(&cfg)
		}
		c, err := Start(t.Context(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Stop() })
		cs = append(cs, c)
	}
	return peers, cs
}

// leader waits for the set's leader.
func leader(t *testing.T, cs []*Coordinator) *Coordinator {
	t.Helper()
	deadline := time.Now().Add(rpcTimeout)
	for time.Now().Before(deadline) {
		for _, c := range cs {
			if c.replica.Leading() {
				return c
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatal("no leader")
	return nil
}

// replicaClient joins the set as an agent does: by the proof of the token,
// then with its node certificate, through a leaderconn over every replica.
type replicaClient struct {
	id  string
	c   gotrainv1.CoordinatorClient
	lc  *leaderconn.Conn
	seq uint64
}

func joinReplicas(t *testing.T, peers []string, host string) *replicaClient {
	t.Helper()
	conn := func(cert *tls.Certificate) *leaderconn.Conn { return replicaConn(t, peers, cert) }
	key, csr, err := jobtls.NewNodeKey()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), rpcTimeout)
	defer cancel()
	resp, err := gotrainv1.NewCoordinatorClient(conn(nil)).Join(ctx, &gotrainv1.JoinRequest{Node: node(host), Csr: csr})
	if err != nil {
		t.Fatalf("join %s: %v", host, err)
	}
	if len(resp.GetReplicas()) != len(peers) {
		t.Errorf("join names replicas %v, want %d", resp.GetReplicas(), len(peers))
	}
	cert := jobtls.NodeCertificate(resp.GetNodeCert(), key)
	lc := conn(&cert)
	return &replicaClient{id: resp.GetNodeId(), c: gotrainv1.NewCoordinatorClient(lc), lc: lc}
}

// replicaConn is a connection to the replica set as an agent has it: by
// the proof of the token alone (the replicas share one CA), and cert (nil
// before Join).
func replicaConn(t *testing.T, peers []string, cert *tls.Certificate) *leaderconn.Conn {
	t.Helper()
	trust := jobtls.Trust{}
	lc, err := leaderconn.New(peers, func(addr string) (*grpc.ClientConn, error) {
		creds, err := trust.Credentials(replicaToken, cert)
		if err != nil {
			return nil, err
		}
		return grpc.NewClient(addr, grpc.WithTransportCredentials(creds), token.DialOption(replicaToken))
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lc.Close() })
	return lc
}

// next returns the node's next event, opening the stream again (after the
// last event it got) when it breaks, as an agent does.
func (r *replicaClient) next(t *testing.T, ctx context.Context) *gotrainv1.GenerationEvent {
	t.Helper()
	ev, err := r.nextEvent(ctx)
	if err != nil {
		t.Fatalf("watch %s: %v", r.id, err)
	}
	return ev
}

// nextEvent is next without the test: the stream stays open after it (the
// node stays attached) until ctx ends or another stream of it opens.
func (r *replicaClient) nextEvent(ctx context.Context) (*gotrainv1.GenerationEvent, error) {
	for {
		s, err := r.c.WatchGenerations(ctx, &gotrainv1.WatchGenerationsRequest{NodeId: r.id, AfterSeq: r.seq})
		if err != nil {
			return nil, err
		}
		ev, err := s.Recv()
		if err == nil {
			r.seq = ev.GetSeq()
			return ev, nil
		}
		if status.Code(err) != codes.Unavailable || ctx.Err() != nil {
			return nil, err
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// startAll returns each node's first event, their streams opened at once,
// as agents open theirs: a job starts once all its nodes attached.
func startAll(t *testing.T, ctx context.Context, rs ...*replicaClient) []*gotrainv1.GenerationEvent {
	t.Helper()
	evs, errs := make([]*gotrainv1.GenerationEvent, len(rs)), make([]error, len(rs))
	var wg sync.WaitGroup
	for i, r := range rs {
		wg.Go(func() { evs[i], errs[i] = r.nextEvent(ctx) })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("watch %s: %v", rs[i].id, err)
		}
	}
	return evs
}

// hold keeps a watch stream of r open until the test ends, opening it
// again when it breaks (at a new leader), as an agent does: the node stays
// attached. The test does not read r's events itself then.
func (r *replicaClient) hold(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	t.Cleanup(func() { cancel(); <-done })
	go func() {
		defer close(done)
		var seq uint64
		for ctx.Err() == nil {
			if s, err := r.c.WatchGenerations(ctx, &gotrainv1.WatchGenerationsRequest{NodeId: r.id, AfterSeq: seq}); err == nil {
				for ev, err := s.Recv(); err == nil; ev, err = s.Recv() {
					seq = ev.GetSeq()
				}
			}
			select {
			case <-ctx.Done():
			case <-time.After(50 * time.Millisecond):
			}
		}
	}()
}

// Three standalone replicas, two nodes: the leader is stopped while the
// job runs; the rest carry on with no generation change: the KV value put
// before is there, a barrier completes, and the job finishes with restart
// count 0.
func TestReplicatedLeaderLoss(t *testing.T) {
	peers, cs := startReplicas(t, 3, 2)
	// Replicas started apart without --run-id name the job alike.
	for _, c := range cs[1:] {
		if got, want := c.Config().RunID, cs[0].Config().RunID; got != want || !strings.HasPrefix(got, "gotrain-") {
			t.Errorf("run ids %q and %q: want one run id per job, gotrain-...", got, want)
		}
	}
	a, b := joinReplicas(t, peers, "host-a"), joinReplicas(t, peers, "host-b")
	ctx, cancel := context.WithTimeout(t.Context(), 2*rpcTimeout)
	defer cancel()
	first := startAll(t, ctx, a, b)
	evA, evB := first[0], first[1]
	if evA.GetStarted() == nil || evB.GetStarted() == nil || evA.GetStarted().GetRestartCount() != 0 {
		t.Fatalf("first events: %v / %v", evA, evB)
	}
	gen := evA.GetStarted().GetGeneration()
	if _, err := a.c.KVPut(ctx, &gotrainv1.KVPutRequest{Key: "before", Value: []byte("v")}); err != nil {
		t.Fatal(err)
	}

	old := leader(t, cs)
	if err := old.Stop(); err != nil {
		t.Fatal(err)
	}
	var rest []*Coordinator
	for _, c := range cs {
		if c != old {
			rest = append(rest, c)
		}
	}
	if nl := leader(t, rest); nl == old {
		t.Fatal("the stopped replica still leads")
	}

	got, err := b.c.KVGet(ctx, &gotrainv1.KVGetRequest{Key: "before", WaitMs: 5000})
	if err != nil || string(got.GetValue()) != "v" {
		t.Fatalf("KV after the leader's loss: %v, %v", got, err)
	}
	done := make(chan error, 2)
	for i, n := range []*replicaClient{a, b} {
		go func() {
			_, err := n.c.Barrier(ctx, &gotrainv1.BarrierRequest{Name: "after", Generation: gen, Rank: int32(i)})
			done <- err
		}()
	}
	for range 2 {
		if err := <-done; err != nil {
			t.Fatalf("barrier at the new leader: %v", err)
		}
	}
	for i, n := range []*replicaClient{a, b} {
		if _, err := n.c.ReportWorkerExit(ctx, &gotrainv1.ReportWorkerExitRequest{NodeId: n.id, Generation: gen, Rank: int32(i), Pid: int32(100 + i)}); err != nil {
			t.Fatalf("report exit: %v", err)
		}
	}
	for _, n := range []*replicaClient{a, b} {
		ev := n.next(t, ctx)
		if ev.GetFinished() == nil || !ev.GetFinished().GetSucceeded() {
			t.Fatalf("%s: after the leader's loss got %v, want finished (no new generation)", n.id, ev)
		}
	}
}

// Two of three replicas lost: no majority, and calls say so.
func TestReplicatedNoMajority(t *testing.T) {
	peers, cs := startReplicas(t, 3, 2)
	a := joinReplicas(t, peers, "host-a")
	l := leader(t, cs)
	for _, c := range cs {
		if c != l {
			_ = c.Stop()
		}
	}
	// The leader steps down once it misses the majority (its lease), and
	// after a few seconds without one every replica says why.
	var msg string
	for deadline := time.Now().Add(rpcTimeout); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		_, err := a.c.GetJobStatus(ctx, &gotrainv1.GetJobStatusRequest{})
		cancel()
		if msg = status.Convert(err).Message(); strings.Contains(msg, "no majority") {
			break
		}
	}
	if !strings.Contains(msg, "no majority") {
		t.Fatalf("without a majority, calls end with %q, which does not say so", msg)
	}
}

// A standalone replica that is restarted (same --peers and --listen, empty
// state) rejoins: the leader replays the log to it, and it can then make
// the majority when the leader is lost.
func TestReplicaRestartRejoins(t *testing.T) {
	peers, cs := startReplicas(t, 3, 2)
	a := joinReplicas(t, peers, "host-a")
	a.hold(t) // attached throughout, as its agent would be
	l := leader(t, cs)
	var follower *Coordinator
	for _, c := range cs {
		if c != l {
			follower = c
			break
		}
	}
	listen := follower.Config().Listen
	if err := follower.Stop(); err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig()
	cfg.JobToken, cfg.Listen, cfg.Peers, cfg.Nodes, cfg.MinNodes, cfg.NoGossip, cfg.MaxRestarts = replicaToken, listen, peers, 2, 2, true, 0
	var back *Coordinator
	var err error
	for deadline := time.Now().Add(rpcTimeout); ; time.Sleep(100 * time.Millisecond) {
		// The port may linger a moment after the stop.
		if back, err = Start(t.Context(), cfg); err == nil || time.Now().After(deadline) {
			break
		}
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = back.Stop() })
	// Caught up: it knows host-a's node.
	waitUntil := time.Now().Add(rpcTimeout)
	for !back.srv.HasNode(a.id) {
		if time.Now().After(waitUntil) {
			t.Fatal("the restarted replica never learnt the job's state")
		}
		time.Sleep(50 * time.Millisecond)
	}
	// The leader goes; the restarted replica and the third make the majority.
	_ = l.Stop()
	b := joinReplicas(t, peers, "host-b")
	ctx, cancel := context.WithTimeout(t.Context(), 2*rpcTimeout)
	defer cancel()
	if ev := b.next(t, ctx); ev.GetStarted() == nil {
		t.Fatalf("after the leader's loss, the second node got %v, want the job started", ev)
	}
}

// TestLeaderHandsOverWhenAgentsGoUnheard: three standalone replicas, two
// nodes heartbeating (ReportProgress) to the leader; once no heartbeat
// reaches the leader any more (as when the agents cannot reach it while
// the replicas can), it hands the lead to another replica; once the
// agents heartbeat again there, it keeps the lead.
func TestLeaderHandsOverWhenAgentsGoUnheard(t *testing.T) {
	peers, cs := startReplicas(t, 3, 2)
	a, b := joinReplicas(t, peers, "host-a"), joinReplicas(t, peers, "host-b")
	a.hold(t) // attached, as their agents would be
	b.hold(t)
	ctx, cancel := context.WithTimeout(t.Context(), 4*rpcTimeout)
	defer cancel()
	beat := func() {
		t.Helper()
		for _, n := range []*replicaClient{a, b} {
			if _, err := n.c.ReportProgress(ctx, &gotrainv1.ReportProgressRequest{NodeId: n.id}); err != nil {
				t.Fatalf("heartbeat of %s: %v", n.id, err)
			}
		}
	}
	old := leader(t, cs)
	beat()
	// Silence: the leader hands over within a few heartbeats.
	deadline := time.Now().Add(2 * rpcTimeout)
	for old.replica.Leading() {
		if time.Now().After(deadline) {
			t.Fatalf("the leader still leads %v after the agents went unheard", 2*rpcTimeout)
		}
		time.Sleep(50 * time.Millisecond)
	}
	var rest []*Coordinator
	for _, c := range cs {
		if c != old {
			rest = append(rest, c)
		}
	}
	nl := leader(t, rest)
	// Heard at the new leader, it keeps the lead: one hand-over only.
	for until := time.Now().Add(2 * agentQuorumWait); time.Now().Before(until); time.Sleep(500 * time.Millisecond) {
		beat()
	}
	if !nl.replica.Leading() {
		t.Errorf("the new leader %s handed over although the agents heartbeat there", nl.ReplicaID())
	}
}

// agentQuorumWait is a little over the coordinator's agentQuorumTimeout.
const agentQuorumWait = 4 * time.Second
