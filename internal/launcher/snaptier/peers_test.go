//go:build linux

package snaptier

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/gotrain/gotrain/internal/connguard/connguardtest"
	"github.com/gotrain/gotrain/internal/jobtls"
	"github.com/gotrain/gotrain/internal/memsnap"
	gotrainv1 "github.com/gotrain/gotrain/proto/gotrain/v1"
)

const testToken = "snaptier-test-token"

// testKey is the job's snapshot key of these tests.
var testKey = []byte("the job's snapshot key, 32 bytes")

func nodeCert(t *testing.T, ca *jobtls.CA, node string) tls.Certificate {
	t.Helper()
	key, csr, err := jobtls.NewNodeKey()
	if err != nil {
		t.Fatal(err)
	}
	der, err := ca.IssueNode(node, csr)
	if err != nil {
		t.Fatal(err)
	}
	return jobtls.NodeCertificate(der, key)
}

// agent is one node's snapshot tier: its store and its peer port, served
// over loopback TCP as the agent serves it.
type agent struct {
	node  string
	store *memsnap.Store
	peers *Peers
	addr  string
}

// startAgent serves node's peer port with a store of limit bytes until t
// ends. It publishes no address (no coordinator): clients dial addr.
func startAgent(t *testing.T, ca *jobtls.CA, node string, limit int64) *agent {
	t.Helper()
	st := memsnap.NewStore(limit)
	cert := nodeCert(t, ca, node)
	ctx, cancel := context.WithCancel(context.Background())
	p := NewPeers(ctx, st, node, nil, ca.Cert, cert, testToken, slog.New(slog.DiscardHandler))
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- p.Serve(ctx, lis, testToken, ca.Cert, cert) }()
	t.Cleanup(func() {
		cancel()
		<-done
		p.Close()
		st.Close()
	})
	return &agent{node: node, store: st, peers: p, addr: lis.Addr().String()}
}

// dialAs is a SnapshotPeer client of the agent at addr, node to, that
// presents node as's certificate of ca.
func dialAs(t *testing.T, ca *jobtls.CA, as, to, addr string) gotrainv1.SnapshotPeerClient {
	t.Helper()
	_, client := jobtls.NodePeerTLS(ca.Cert, nodeCert(t, ca, as))
	cc, err := grpc.NewClient(addr, append(memsnap.PeerDialOptions(), grpc.WithTransportCredentials(jobtls.PeerCredentials(client(to), testToken)))...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return gotrainv1.NewSnapshotPeerClient(cc)
}

// snapshotOf is rank's snapshot of step, data, as a worker hands it to
// its agent's store st (over the real snapshot socket).
func snapshotOf(t *testing.T, st *memsnap.Store, rank int, step int64, data []byte) *memsnap.Snapshot {
	t.Helper()
	sock := filepath.Join(t.TempDir(), memsnap.SocketName)
	lis, err := memsnap.Listen(sock)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- (&memsnap.Server{Store: st, Token: testToken}).Serve(ctx, lis) }()
	defer func() { cancel(); <-done }()
	c, err := memsnap.Dial(t.Context(), sock, testToken, rank)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	b, err := memsnap.NewBuffer(int64(len(data)))
	if err != nil {
		t.Fatal(err)
	}
	copy(b.Bytes(), data)
	if err := c.Commit(b, step); err != nil {
		t.Fatal(err)
	}
	s, ok := st.Acquire(rank)
	if !ok {
		t.Fatalf("the store holds no snapshot of rank %d", rank)
	}
	t.Cleanup(func() { st.Release(s) })
	return s
}

// generation is generation gen of the nodes given as id: ranks, with
// this agent as group rank self.
func generation(gen int64, self int, nodes ...Member) Generation {
	return Generation{Gen: gen, GroupRank: self, Members: nodes, Key: testKey}
}

// guardCounts are the connections p's port holds, unauthenticated and
// authenticated.
func guardCounts(p *Peers) (int, int) {
	p.mu.Lock()
	g := p.guard
	p.mu.Unlock()
	return g.Counts()
}

func wantDenied(t *testing.T, what string, err error, says ...string) {
	t.Helper()
	if status.Code(err) != codes.PermissionDenied {
		t.Errorf("%s: %v, want PermissionDenied", what, err)
		return
	}
	for _, s := range says {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("%s: %v, want it to say %q", what, err, s)
		}
	}
}

// Issue N3: the peer port trusted any node certificate of the job CA for
// any rank; certificates outlive membership. Now it admits only the nodes
// of the generation the agent runs, a replica only for a rank the sender
// runs, a fetch only for a rank the caller runs now; a departed node's
// still-valid certificate is refused, naming the node and why; and a
// refused connection never reaches the authenticated budget.
func TestPeerPortAdmitsOnlyTheGenerationsNodes(t *testing.T) {
	ca, err := jobtls.NewCA("run")
	if err != nil {
		t.Fatal(err)
	}
	a2 := startAgent(t, ca, "node-2", 0)
	sender := memsnap.NewStore(0)
	t.Cleanup(sender.Close)
	sender.SetKey(testKey)
	g3 := generation(3, 1, Member{"node-1", 0, []int{0, 1}}, Member{"node-2", 1, []int{2, 3}})
	a2.peers.Generation(g3, "")
	ctx := t.Context()
	n1 := dialAs(t, ca, "node-1", "node-2", a2.addr)
	departed := dialAs(t, ca, "node-9", "node-2", a2.addr) // a valid certificate of this job's CA

	data := []byte("rank 0's training state")
	if err := memsnap.Replicate(ctx, n1, snapshotOf(t, sender, 0, 40, data), "node-1", 3); err != nil {
		t.Fatalf("node-1 replicates its rank 0: %v", err)
	}
	// node-1 sends a snapshot as rank 2, node-2's own rank.
	wantDenied(t, "node-1 replicates rank 2 (node-2's)", memsnap.Replicate(ctx, n1, snapshotOf(t, sender, 2, 41, data), "node-1", 3), `node "node-1"`, "rank 2 does not run on it")
	if _, ok := a2.store.AcquireReplica(2); ok {
		t.Error("node-2 keeps a replica of its own rank 2 that node-1 sent")
	}
	_, err = n1.Have(ctx, &gotrainv1.PeerSnapshotRequest{Rank: 2, Generation: 3})
	wantDenied(t, "node-1 asks for rank 2, which it does not run", err, "rank 2 does not run on it")
	_, err = departed.Have(ctx, &gotrainv1.PeerSnapshotRequest{Rank: 0, Generation: 3})
	wantDenied(t, "node-9, not in generation 3, asks for rank 0", err, `node "node-9"`, "not a node of generation 3")
	wantDenied(t, "node-9 replicates", memsnap.Replicate(ctx, departed, snapshotOf(t, sender, 1, 50, data), "node-9", 3), "not a node of generation 3")
	if unauth, auth := guardCounts(a2.peers); auth != 1 || unauth != 1 {
		t.Errorf("the port holds %d unauthenticated and %d authenticated connections; want node-9's refused one unauthenticated, node-1's authenticated", unauth, auth)
	}

	// Generation 4: node-1 left, node-3 took its ranks. node-1's
	// certificate is still valid; it is refused. node-3 fetches rank 0,
	// asking as of generation 4 before node-2 runs it: the call waits for
	// node-2 to learn of it.
	n3 := dialAs(t, ca, "node-3", "node-2", a2.addr)
	type fetched struct {
		f     memsnap.Fetched
		found bool
		err   error
	}
	res := make(chan fetched, 1)
	go func() {
		f, found, err := memsnap.FetchReplica(ctx, n3, 0, 4)
		res <- fetched{f, found, err}
	}()
	a2.peers.Generation(generation(4, 1, Member{"node-3", 0, []int{0, 1}}, Member{"node-2", 1, []int{2, 3}}), "")
	r := <-res
	if r.err != nil || !r.found || r.f.Step != 40 {
		t.Fatalf("node-3 fetches rank 0, which it took over: %+v, %v, %v", r.f, r.found, r.err)
	}
	fetcher := memsnap.NewStore(0)
	t.Cleanup(fetcher.Close)
	fetcher.SetKey(testKey)
	if err := fetcher.CheckFetched(0, r.f); err != nil {
		t.Errorf("the MAC of the replica node-3 fetched: %v", err)
	}
	_ = os.NewFile(uintptr(r.f.Fd), "replica").Close()
	_, err = n1.Have(ctx, &gotrainv1.PeerSnapshotRequest{Rank: 0, Generation: 4})
	wantDenied(t, "node-1, departed, asks for its former rank 0", err, `node "node-1"`, "not a node of generation 4", "left the job")
	_, _, err = memsnap.FetchReplica(ctx, n1, 0, 3)
	wantDenied(t, "node-1, departed, fetches as of generation 3", err, "not a node of generation 4")
}

// Issue N1: the peer port had no connection bound and no handshake
// deadline: 20000 silent connections took every descriptor of the agent,
// and the next worker crash could not be restarted. Now a flood, from one
// address or many, keeps at most the port's unauthenticated budget open,
// and a member's replica and fetch still go through meanwhile.
func TestPeerPortFloodLeavesReplicasDeliverable(t *testing.T) {
	ca, err := jobtls.NewCA("run")
	if err != nil {
		t.Fatal(err)
	}
	a2 := startAgent(t, ca, "node-2", 0)
	a2.peers.Generation(generation(1, 1, Member{"node-1", 0, []int{0}}, Member{"node-2", 1, []int{1}}), "")
	sender := memsnap.NewStore(0)
	t.Cleanup(sender.Close)
	sender.SetKey(testKey)

	var flood []net.Conn
	for i := range 8 { // 8 addresses of the loopback network
		flood = append(flood, connguardtest.Flood(t, fmt.Sprintf("127.0.0.%d", 2+i), a2.addr, 400)...)
	}
	flood = append(flood, connguardtest.Flood(t, "127.0.0.1", a2.addr, 1000)...)
	if open := connguardtest.StillOpen(flood, MaxPeerPending, time.Minute); open > MaxPeerPending {
		t.Fatalf("%d of %d flood connections still open, want at most %d", open, len(flood), MaxPeerPending)
	}
	if unauth, _ := guardCounts(a2.peers); unauth > MaxPeerPending {
		t.Errorf("the port holds %d unauthenticated connections, over its %d", unauth, MaxPeerPending)
	}
	// The agent can still open files (a worker's restart opens /dev/null
	// and its log) and a member's replica goes through.
	f, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatalf("open %s during the flood: %v", os.DevNull, err)
	}
	f.Close()
	n1 := dialAs(t, ca, "node-1", "node-2", a2.addr)
	data := []byte("still deliverable")
	if err := memsnap.Replicate(t.Context(), n1, snapshotOf(t, sender, 0, 9, data), "node-1", 1); err != nil {
		t.Fatalf("node-1's replica during the flood: %v", err)
	}
	fetched, found, err := memsnap.FetchReplica(t.Context(), n1, 0, 1)
	if err != nil || !found || fetched.Step != 9 {
		t.Fatalf("node-1's fetch during the flood: %+v, %v, %v", fetched, found, err)
	}
	_ = os.NewFile(uintptr(fetched.Fd), "replica").Close()

}

func TestMayCall(t *testing.T) {
	g := generation(2, 0, Member{"a", 0, []int{0, 1}}, Member{"b", 1, []int{2}})
	for _, c := range []struct {
		started     bool
		node, call  string
		rank        int
		ok          bool
		errContains string
	}{
		{true, "a", "replicate", 1, true, ""},
		{true, "b", "fetch", 2, true, ""},
		{true, "a", "replicate", 2, false, "a node replicates only its own ranks"},
		{true, "b", "fetch", 0, false, "a node fetches only the ranks it runs now"},
		{true, "gone", "fetch", 0, false, `node "gone": it is not a node of generation 2`},
		{true, "", "fetch", 0, false, "no node certificate"},
		{false, "a", "replicate", 0, false, "no generation yet"},
	} {
		err := mayCall(g, c.started, c.node, c.call, c.rank)
		if (err == nil) != c.ok || err != nil && (!errors.Is(err, memsnap.ErrPeerRefused) || !strings.Contains(err.Error(), c.errContains)) {
			t.Errorf("mayCall(started %v, %q, %s, rank %d) = %v; want ok %v or an ErrPeerRefused saying %q", c.started, c.node, c.call, c.rank, err, c.ok, c.errContains)
		}
	}
}
