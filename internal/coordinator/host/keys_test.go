package host

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/gotrain/gotrain/internal/jobtls"
	gotrainv1 "github.com/gotrain/gotrain/proto/gotrain/v1"
)

// A token holder derived the job CA from the token, minted
// replica and node certificates, won Raft leadership from outside and
// forged every rank's exit. The CA is random now: the best a token holder
// can do is a CA of its own, whose replica certificate Raft's transport
// refuses and whose node certificate (any node's name) the coordinator
// refuses; and a coordinator's CA is not the same twice for one token.
func TestTokenHolderCannotMintCertificates(t *testing.T) {
	peers, cs := startReplicas(t, 3, 1)
	ld := leader(t, cs)
	for _, c := range cs[1:] {
		if c.CAHash() != cs[0].CAHash() {
			t.Fatalf("replicas of one set have CAs %s and %s", cs[0].CAHash(), c.CAHash())
		}
	}
	// The same token, another coordinator: another CA (nothing derived).
	other := testConfig()
	other.JobToken = replicaToken
	oc, err := Start(t.Context(), other)
	if err != nil {
		t.Fatal(err)
	}
	defer oc.Stop()
	if oc.CAHash() == cs[0].CAHash() {
		t.Fatal("two coordinators of one token have one CA: it is derivable from the token")
	}

	mine, err := jobtls.NewCA("attacker")
	if err != nil {
		t.Fatal(err)
	}
	rc, err := mine.ReplicaCertificate(peers[0], []string{"127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	// Raft's transport: mutual TLS with replica certificates of the job CA.
	_, client := jobtls.ReplicaTLS(mine, rc)
	for _, c := range cs {
		conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 10 * time.Second}, "tcp", c.RaftAddr(), client)
		if err == nil {
			_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
			_, err = conn.Read(make([]byte, 1)) // TLS 1.3: the server's refusal comes after the client's handshake
			conn.Close()
		}
		if err == nil {
			t.Errorf("replica %s's Raft port took a replica certificate of the attacker's CA", c.RaftAddr())
		}
	}

	// The coordinator's gRPC: a node certificate of the attacker's CA,
	// naming a node of the job, is refused in the handshake.
	a := joinReplicas(t, peers, "host-a")
	key, csr, _ := jobtls.NewNodeKey()
	der, err := mine.IssueNode(a.id, csr)
	if err != nil {
		t.Fatal(err)
	}
	forged := jobtls.NodeCertificate(der, key)
	creds, _ := jobtls.Trust{CAHash: ld.CAHash()}.Credentials(replicaToken, &forged)
	cc, err := grpc.NewClient(ld.Addr().String(), grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(t.Context(), rpcTimeout)
	defer cancel()
	_, err = gotrainv1.NewCoordinatorClient(cc).ReportWorkerExit(ctx, &gotrainv1.ReportWorkerExitRequest{NodeId: a.id, Rank: 0, ExitCode: 0})
	if err == nil {
		t.Fatalf("a forged certificate of %s reported its rank's exit", a.id)
	}
	t.Logf("forged node certificate: %v", err)
	// Sent regardless of the CAs the server asks for: the handshake fails.
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 10 * time.Second}, "tcp", ld.Addr().String(), &tls.Config{
		InsecureSkipVerify: true, MinVersion: tls.VersionTLS13, NextProtos: []string{"h2"},
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &forged, nil },
	})
	if err == nil {
		_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
		_, err = conn.Read(make([]byte, 1))
		conn.Close()
	}
	if err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Errorf("a forged node certificate sent anyway: %v; want the handshake refused", err)
	}
}

// nodeAt joins the embedded coordinator at addr as a node at address,
// by the proof of the token, then dials it with its node certificate.
func nodeAt(t *testing.T, addr, hostname, address string) (id string, resp *gotrainv1.JoinResponse, c gotrainv1.CoordinatorClient) {
	t.Helper()
	key, csr, _ := jobtls.NewNodeKey()
	dial := func(cert *tls.Certificate) gotrainv1.CoordinatorClient {
		creds, err := jobtls.Trust{}.Credentials(testToken, cert)
		if err != nil {
			t.Fatal(err)
		}
		cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cc.Close() })
		return gotrainv1.NewCoordinatorClient(cc)
	}
	ctx, cancel := context.WithTimeout(t.Context(), rpcTimeout)
	defer cancel()
	n := node(hostname)
	n.Address = address
	resp, err := dial(nil).Join(ctx, &gotrainv1.JoinRequest{Node: n, Csr: csr})
	if err != nil {
		t.Fatalf("join %s: %v", hostname, err)
	}
	cert := jobtls.NodeCertificate(resp.GetNodeCert(), key)
	return resp.GetNodeId(), resp, dial(&cert)
}

// Three AddReplica calls from a token holder added fake voters
// and killed the job. Only the node the coordinator asked to host a
// replica, calling with its own node certificate, for its own replica on
// its own host, gets the CA or is added; every other call is refused
// with PermissionDenied, and Raft's configuration is unchanged.
func TestReplicaAdmissionOnlyForTheAskedNode(t *testing.T) {
	cfg := testConfig()
	cfg.Nodes, cfg.Replicas, cfg.NoGossip = 3, 3, true
	c, err := Start(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Stop()
	addr := c.Addr().String()
	waitLeading(t, c)
	n1, r1, c1 := nodeAt(t, addr, "host-1", "127.0.0.1") // the first node: its own replica
	n2, r2, c2 := nodeAt(t, addr, "host-2", "127.0.0.2")
	if r1.GetHostReplica() || !r2.GetHostReplica() {
		t.Fatalf("host_replica: %s %v, %s %v; want only %s asked", n1, r1.GetHostReplica(), n2, r2.GetHostReplica(), n2)
	}
	if jobtls.Hash(mustParse(t, r2.GetCaCert())) != c.CAHash() {
		t.Errorf("Join names CA %x, not the coordinator's %s", r2.GetCaCert()[:8], c.CAHash())
	}
	// A token holder without a node certificate.
	creds, _ := jobtls.Trust{}.Credentials(testToken, nil)
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	holder := gotrainv1.NewCoordinatorClient(cc)

	ctx, cancel := context.WithTimeout(t.Context(), rpcTimeout)
	defer cancel()
	add := func(n string, ip string) *gotrainv1.AddReplicaRequest {
		return &gotrainv1.AddReplicaRequest{NodeId: n, Addr: ip + ":40000", RaftAddr: ip + ":40003"}
	}
	for _, tc := range []struct {
		name string
		c    gotrainv1.CoordinatorClient
		req  *gotrainv1.AddReplicaRequest
	}{
		{"a token holder for the asked node", holder, add(n2, "127.0.0.2")},
		{"a token holder for itself", holder, add("node-99", "127.0.0.9")},
		{"a node not asked", c1, add(n1, "127.0.0.1")},
		{"the asked node, a replica on another host", c2, add(n2, "127.0.0.9")},
	} {
		_, err := tc.c.AddReplica(ctx, tc.req)
		if status.Code(err) != codes.PermissionDenied {
			t.Errorf("AddReplica by %s: %v, want PermissionDenied", tc.name, err)
		}
	}
	// Another node for the asked one: a third node, also asked.
	n3, r3, c3 := nodeAt(t, addr, "host-3", "127.0.0.3")
	if !r3.GetHostReplica() {
		t.Fatalf("%s not asked to host a replica", n3)
	}
	if _, err := c3.AddReplica(ctx, add(n2, "127.0.0.2")); status.Code(err) != codes.PermissionDenied {
		t.Errorf("AddReplica by %s for %s: %v, want PermissionDenied", n3, n2, err)
	}
	for _, tc := range []struct {
		name string
		c    gotrainv1.CoordinatorClient
		id   string
	}{
		{"a token holder", holder, n2},
		{"a node not asked", c1, n1},
		{"another node for the asked one", c3, n2},
	} {
		if _, err := tc.c.ReplicaCA(ctx, &gotrainv1.ReplicaCARequest{NodeId: tc.id}); status.Code(err) != codes.PermissionDenied {
			t.Errorf("ReplicaCA by %s: %v, want PermissionDenied", tc.name, err)
		}
	}
	if got := len(c.replica.Peers()); got != 1 {
		t.Fatalf("Raft has %d voters after the refused calls, want 1", got)
	}

	// The asked node: it gets the CA, starts its replica on its host, and
	// is added.
	resp, err := c2.ReplicaCA(ctx, &gotrainv1.ReplicaCARequest{NodeId: n2})
	if err != nil {
		t.Fatalf("ReplicaCA by the asked node: %v", err)
	}
	ca, err := jobtls.ParseCA(resp.GetCaCert(), resp.GetCaKey())
	if err != nil || ca.Hash() != c.CAHash() {
		t.Fatalf("the CA handed over: %v, hash %v; want %s", err, ca, c.CAHash())
	}
	rcfg := testConfig()
	rcfg.Listen, rcfg.JoinReplica, rcfg.CA, rcfg.NoGossip, rcfg.Nodes = "127.0.0.2:0", true, ca, true, 3
	hosted, err := Start(t.Context(), rcfg)
	if err != nil {
		t.Fatal(err)
	}
	defer hosted.Stop()
	if _, err := c2.AddReplica(ctx, &gotrainv1.AddReplicaRequest{NodeId: n2, Addr: hosted.ReplicaID(), RaftAddr: hosted.RaftAddr()}); err != nil {
		t.Fatalf("AddReplica by the asked node: %v", err)
	}
	if got := len(c.replica.Peers()); got != 2 {
		t.Errorf("Raft has %d voters, want 2", got)
	}
	// Asked once, added once.
	if _, err := c2.ReplicaCA(ctx, &gotrainv1.ReplicaCARequest{NodeId: n2}); status.Code(err) != codes.PermissionDenied {
		t.Errorf("ReplicaCA again after the replica was added: %v, want PermissionDenied", err)
	}
}

func waitLeading(t *testing.T, c *Coordinator) {
	t.Helper()
	deadline := time.Now().Add(rpcTimeout)
	for !c.replica.Leading() {
		if time.Now().After(deadline) {
			t.Fatal("the first replica does not lead")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func mustParse(t *testing.T, der []byte) *x509.Certificate {
	t.Helper()
	c, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// A standalone replica hands the job CA only to a caller from a listed
// peer's host whose connection proved the token: from another address,
// PermissionDenied; from a peer's host, the set's CA.
func TestStandaloneReplicaCAOnlyToListedPeers(t *testing.T) {
	peers, cs := startReplicas(t, 3, 1)
	ask := func(from string) (*gotrainv1.ReplicaCAResponse, error) {
		creds, err := jobtls.Trust{}.Credentials(replicaToken, nil)
		if err != nil {
			t.Fatal(err)
		}
		d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}}
		cc, err := grpc.NewClient(peers[0], grpc.WithTransportCredentials(creds),
			grpc.WithContextDialer(func(ctx context.Context, a string) (net.Conn, error) { return d.DialContext(ctx, "tcp", a) }))
		if err != nil {
			t.Fatal(err)
		}
		defer cc.Close()
		ctx, cancel := context.WithTimeout(t.Context(), rpcTimeout)
		defer cancel()
		return gotrainv1.NewCoordinatorClient(cc).ReplicaCA(ctx, &gotrainv1.ReplicaCARequest{})
	}
	if _, err := ask("127.0.0.2"); status.Code(err) != codes.PermissionDenied {
		t.Errorf("ReplicaCA from a host --peers does not list: %v, want PermissionDenied", err)
	}
	resp, err := ask("127.0.0.1")
	if err != nil {
		t.Fatalf("ReplicaCA from a listed peer's host: %v", err)
	}
	if ca, err := jobtls.ParseCA(resp.GetCaCert(), resp.GetCaKey()); err != nil || ca.Hash() != cs[0].CAHash() {
		t.Errorf("the CA handed over: %v; want %s", err, cs[0].CAHash())
	}
}
