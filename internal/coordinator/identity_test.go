package coordinator

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/gotrain/gotrain/internal/coordinator/job"
	"github.com/gotrain/gotrain/internal/jobtls"
	"github.com/gotrain/gotrain/internal/launcher/snaptier"
	"github.com/gotrain/gotrain/internal/token"
	gotrainv1 "github.com/gotrain/gotrain/proto/gotrain/v1"
	"github.com/gotrain/gotrain/worker/cpucomm"
	"github.com/gotrain/gotrain/worker/ncclcomm"
)

// tlsNode is one node of a job served with a job CA: its id, and a client
// that presents its certificate.
type tlsNode struct {
	id string
	c  gotrainv1.CoordinatorClient
}

// startTLSJob serves a job of n one-rank nodes with a job CA, joins them
// (each with its own key, as agents do) and waits until they run.
func startTLSJob(t *testing.T, n int) (*Server, string, *jobtls.CA, []tlsNode) {
	t.Helper()
	ca, err := jobtls.NewCA("run-test")
	if err != nil {
		t.Fatal(err)
	}
	cert, err := ca.ServerCertificate(nil)
	if err != nil {
		t.Fatal(err)
	}
	srv, addr := startServer(t, Config{Job: job.Config{Nodes: n}, CA: ca, TLS: jobtls.ServerConfig(cert, ca)}, testHooks{})
	trust := jobtls.Trust{CAHash: ca.Hash()}
	var nodes []tlsNode
	for i := range n {
		key, csr, err := jobtls.NewNodeKey()
		if err != nil {
			t.Fatal(err)
		}
		joinCreds, _ := trust.Credentials(testToken, nil)
		resp, err := dial(t, addr, withCreds(joinCreds), token.DialOption(testToken)).Join(rpcCtx(t), &gotrainv1.JoinRequest{
			Node: &gotrainv1.NodeInfo{Hostname: "host-" + string(rune('a'+i)), Address: "127.0.0.1", Nproc: 1, FreePort: 1, AgentPid: 4000}, Csr: csr})
		if err != nil {
			t.Fatalf("join: %v", err)
		}
		c := jobtls.NodeCertificate(resp.GetNodeCert(), key)
		creds, _ := trust.Credentials(testToken, &c)
		nodes = append(nodes, tlsNode{id: resp.GetNodeId(), c: dial(t, addr, withCreds(creds), token.DialOption(testToken))})
	}
	// The nodes attach, as agents do (their watch streams open), and the
	// job starts on them.
	ctx, detach := context.WithCancel(context.Background())
	t.Cleanup(detach)
	var streams []grpc.ServerStreamingClient[gotrainv1.GenerationEvent]
	for _, nd := range nodes {
		s, err := nd.c.WatchGenerations(ctx, &gotrainv1.WatchGenerationsRequest{NodeId: nd.id})
		if err != nil {
			t.Fatalf("watch %s: %v", nd.id, err)
		}
		streams = append(streams, s)
	}
	for i, s := range streams {
		if ev, err := s.Recv(); err != nil || ev.GetStarted() == nil {
			t.Fatalf("%s's first event: %v, %v; want started", nodes[i].id, ev, err)
		}
	}
	return srv, addr, ca, nodes
}

// rankOn is the rank node runs in generation 0.
func rankOn(t *testing.T, srv *Server, node string) int32 {
	t.Helper()
	srv.mu.Lock()
	defer srv.mu.Unlock()
	for r := range 64 {
		if id, ok := srv.st.Machine().NodeOfRank(0, r); ok && id == node {
			return int32(r)
		}
	}
	t.Fatalf("node %s runs no rank", node)
	return -1
}

// Any token holder could act as any node — report
// another node's rank as exited (ending or failing the job), forge its
// progress, watch its stream (taking its events away from it), arrive at a
// barrier for its ranks, publish a communicator's id in its place. With
// node certificates each of these is PermissionDenied, and the node's own
// calls still work.
func TestNodeActsOnlyForItself(t *testing.T) {
	srv, _, _, nodes := startTLSJob(t, 2)
	a, b := nodes[0], nodes[1]
	rankA, rankB := rankOn(t, srv, a.id), rankOn(t, srv, b.id)
	ctx := rpcCtx(t)

	denied := func(what string, err error) {
		t.Helper()
		if status.Code(err) != codes.PermissionDenied {
			t.Errorf("%s: got %v, want PermissionDenied", what, err)
		} else if !strings.Contains(status.Convert(err).Message(), "only for") {
			t.Errorf("%s: the message does not say why: %v", what, err)
		}
	}
	// b acts for a.
	_, err := b.c.ReportWorkerExit(ctx, &gotrainv1.ReportWorkerExitRequest{NodeId: a.id, Generation: 0, Rank: rankA, ExitCode: 0})
	denied("b reports a's rank exited", err)
	_, err = b.c.ReportProgress(ctx, &gotrainv1.ReportProgressRequest{NodeId: a.id, Ranks: []*gotrainv1.RankProgress{{Rank: rankA, Generation: 0, Step: 240}}})
	denied("b reports a's progress", err)
	_, err = b.c.ReportEvidence(ctx, &gotrainv1.ReportEvidenceRequest{NodeId: a.id})
	denied("b reports a's evidence", err)
	stream, err := b.c.WatchGenerations(ctx, &gotrainv1.WatchGenerationsRequest{NodeId: a.id})
	if err == nil {
		_, err = stream.Recv()
	}
	denied("b watches a's stream", err)
	_, err = b.c.Barrier(ctx, &gotrainv1.BarrierRequest{Name: "x", Generation: 0, Rank: rankA})
	denied("b arrives at a barrier for a's rank", err)
	owner, other := a, b
	if rankB == 0 {
		owner, other = b, a
	}
	_, err = other.c.KVPut(ctx, &gotrainv1.KVPutRequest{Key: ncclcomm.IDKey("world", 0), Value: []byte("poison")})
	denied("a node without rank 0 publishes the NCCL id", err)
	_, err = b.c.KVPut(ctx, &gotrainv1.KVPutRequest{Key: cpucomm.AddrKey("world", 0, int(rankA)), Value: []byte("10.0.0.66:1")})
	denied("b publishes a's rank's address", err)
	_, err = b.c.KVPut(ctx, &gotrainv1.KVPutRequest{Key: cpucomm.AddrKey("world", 1, int(rankB)), Value: []byte("10.0.0.66:1")})
	if status.Code(err) != codes.PermissionDenied {
		t.Errorf("b pre-writes its own rank's address of a later generation: %v, want PermissionDenied", err)
	}

	// The same calls for itself go through.
	if _, err := owner.c.KVPut(ctx, &gotrainv1.KVPutRequest{Key: ncclcomm.IDKey("world", 0), Value: []byte("id")}); err != nil {
		t.Errorf("rank 0's node publishes the NCCL id: %v", err)
	}
	if _, err := b.c.KVPut(ctx, &gotrainv1.KVPutRequest{Key: cpucomm.AddrKey("world", 0, int(rankB)), Value: []byte("127.0.0.1:1")}); err != nil {
		t.Errorf("b publishes its rank's address: %v", err)
	}
	if _, err := b.c.KVPut(ctx, &gotrainv1.KVPutRequest{Key: "user/key", Value: []byte("v")}); err != nil {
		t.Errorf("b puts another key: %v", err)
	}
	if _, err := b.c.ReportProgress(ctx, &gotrainv1.ReportProgressRequest{NodeId: b.id, Ranks: []*gotrainv1.RankProgress{{Rank: rankB, Generation: 0, Step: 1}}}); err != nil {
		t.Errorf("b reports its own progress: %v", err)
	}
	stream, err = b.c.WatchGenerations(ctx, &gotrainv1.WatchGenerationsRequest{NodeId: b.id})
	if err == nil {
		_, err = stream.Recv()
	}
	if err != nil {
		t.Errorf("b watches its own stream: %v", err)
	}
	if st := srv.Result(); st != nil {
		t.Errorf("the job finished: %v", st)
	}
}

// A caller with the token but no node certificate (a compromised worker
// holds the token, never its agent's key) cannot make node calls at all;
// it may still join (and get an identity of its own) and read the status.
func TestTokenWithoutNodeCertificate(t *testing.T) {
	_, addr, ca, nodes := startTLSJob(t, 1)
	creds, _ := jobtls.Trust{CAHash: ca.Hash()}.Credentials(testToken, nil)
	c := dial(t, addr, withCreds(creds), token.DialOption(testToken))
	ctx := rpcCtx(t)
	_, err := c.ReportWorkerExit(ctx, &gotrainv1.ReportWorkerExitRequest{NodeId: nodes[0].id, Rank: 0})
	if status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), "node certificate") {
		t.Errorf("exit report without a node certificate: %v", err)
	}
	_, err = c.KVPut(ctx, &gotrainv1.KVPutRequest{Key: "k", Value: []byte("v")})
	wantCode(t, "kv put without a node certificate", err, codes.PermissionDenied)
	if _, err := c.GetJobStatus(ctx, &gotrainv1.GetJobStatusRequest{}); err != nil {
		t.Errorf("status with the token alone: %v", err)
	}
	_, err = c.Join(ctx, &gotrainv1.JoinRequest{Node: &gotrainv1.NodeInfo{Hostname: "h", Address: "127.0.0.1", Nproc: 1, FreePort: 1}})
	wantCode(t, "join without a certificate request", err, codes.InvalidArgument)
}

// Issue N3: any node could put the snapshot tier's address keys, after
// which the other nodes sent it their replicas. Now only the node of the
// key's group rank, in the current generation, may; and the generation's
// start tells each node the generation's nodes and the job's snapshot key
// (the same for all, not the token's).
func TestSnapshotPeerKeysOnlyByTheirNode(t *testing.T) {
	srv, _, _, nodes := startTLSJob(t, 2)
	a, b := nodes[0], nodes[1]
	ctx := rpcCtx(t)
	groupOf := func(id string) int {
		srv.mu.Lock()
		defer srv.mu.Unlock()
		for gr := range 2 {
			if n, ok := srv.st.Machine().NodeOfGroupRank(0, gr); ok && n == id {
				return gr
			}
		}
		t.Fatalf("node %s has no group rank in generation 0", id)
		return -1
	}
	grA, grB := groupOf(a.id), groupOf(b.id)
	for _, c := range []struct{ what, key, want string }{
		{"b publishes its address as a's group rank", snaptier.PeerKey(0, grA), "not this connection's node"},
		{"b publishes its address for a later generation", snaptier.PeerKey(1, grB), "only in the generation it runs"},
		{"b puts another key under the tier's prefix", "gotrain/memsnap/g0/n" + fmt.Sprint(grB) + "/x", "only the snapshot tier's address keys"},
	} {
		_, err := b.c.KVPut(ctx, &gotrainv1.KVPutRequest{Key: c.key, Value: []byte(b.id + " 10.0.0.66:1")})
		if status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want PermissionDenied saying %q", c.what, err, c.want)
		}
	}
	if _, err := b.c.KVPut(ctx, &gotrainv1.KVPutRequest{Key: snaptier.PeerKey(0, grB), Value: []byte(b.id + " 127.0.0.1:1")}); err != nil {
		t.Errorf("b publishes its own snapshot-peer address: %v", err)
	}

	var keys [][]byte
	for _, n := range nodes {
		stream, err := n.c.WatchGenerations(ctx, &gotrainv1.WatchGenerationsRequest{NodeId: n.id})
		if err != nil {
			t.Fatal(err)
		}
		ev, err := stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		g := ev.GetStarted()
		if g == nil || len(g.GetNodes()) != 2 {
			t.Fatalf("node %s's first event: %v, want a start with both nodes", n.id, ev)
		}
		for _, gn := range g.GetNodes() {
			if want := groupOf(gn.GetNodeId()); int(gn.GetGroupRank()) != want || len(gn.GetRanks()) != 1 {
				t.Errorf("the start names node %s as group rank %d with ranks %v; want group rank %d with its one rank", gn.GetNodeId(), gn.GetGroupRank(), gn.GetRanks(), want)
			}
		}
		keys = append(keys, g.GetSnapshotKey())
	}
	if len(keys[0]) != 32 || !bytes.Equal(keys[0], keys[1]) || bytes.Contains(keys[0], []byte(testToken)) {
		t.Errorf("snapshot keys %x and %x: want the same 32 bytes for both nodes", keys[0], keys[1])
	}
}

func TestKeyOwner(t *testing.T) {
	for _, c := range []struct {
		key  string
		gen  int64
		rank int
		ok   bool
	}{
		{ncclcomm.IDKey("world", 3), 3, 0, true},
		{ncclcomm.IDKey("a/b", 7), 7, 0, true},
		{cpucomm.AddrKey("world", 2, 5), 2, 5, true},
		{cpucomm.AddrKey("x/addr/1", 0, 9), 0, 9, true},
		{"ncclcomm/world/x/id", 0, 0, false},
		{"cpucomm/world/1/addr/x", 0, 0, false},
		{"user/key", 0, 0, false},
		{"", 0, 0, false},
	} {
		gen, rank, ok := keyOwner(c.key)
		if ok != c.ok || ok && (gen != c.gen || rank != c.rank) {
			t.Errorf("keyOwner(%q) = %d, %d, %v; want %d, %d, %v", c.key, gen, rank, ok, c.gen, c.rank, c.ok)
		}
	}
}

func withCreds(c credentials.TransportCredentials) grpc.DialOption {
	return grpc.WithTransportCredentials(c)
}
