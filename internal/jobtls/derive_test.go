package jobtls

import (
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"net"
	"strings"
	"testing"
	"time"
)

const (
	secretA = "0123456789abcdef0123456789abcdef"
	secretB = "fedcba9876543210fedcba9876543210"
)

func deriveCA(t *testing.T, secret string) *CA {
	t.Helper()
	ca, err := DeriveCA(secret, "replicated")
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

func TestDeriveCADeterministic(t *testing.T) {
	a1, a2, b := deriveCA(t, secretA), deriveCA(t, secretA), deriveCA(t, secretB)
	if string(a1.Cert.Raw) != string(a2.Cert.Raw) || a1.Hash() != a2.Hash() {
		t.Errorf("the same secret gave two CAs: %s and %s", a1.Hash(), a2.Hash())
	}
	if a1.Hash() == b.Hash() || string(a1.Cert.Raw) == string(b.Cert.Raw) {
		t.Errorf("two secrets gave one CA %s", a1.Hash())
	}
	if !a1.Cert.IsCA || a1.Cert.SignatureAlgorithm != x509.PureEd25519 {
		t.Errorf("IsCA %v, signature %v; want a CA signed with Ed25519", a1.Cert.IsCA, a1.Cert.SignatureAlgorithm)
	}
	// Replicas of different gotrain versions must derive the same CA: a
	// change of the derivation must be a new deriveLabel, on purpose.
	const (
		wantHash = "sha256:f30d121de0df57001ea08c66bc771873124d669e75cadcfeca4d02e5bde6aa45"
		wantRaw  = "e6c19d5880e137f1d6fcc4a33c272db9f6042653ee7f841c8a6bf1ab7950beec"
	)
	raw := sha256.Sum256(a1.Cert.Raw)
	if a1.Hash() != wantHash || hex.EncodeToString(raw[:]) != wantRaw {
		t.Errorf("DeriveCA(%q) changed: Hash %s, SHA-256 of the certificate %x; want %s, %s", secretA, a1.Hash(), raw, wantHash, wantRaw)
	}
}

func TestDeriveCARefusesShortSecret(t *testing.T) {
	for _, s := range []string{"", "tok", secretA[:MinDeriveSecret-1]} {
		if _, err := DeriveCA(s, "replicated"); !errors.Is(err, ErrShortSecret) {
			t.Errorf("DeriveCA(%q): %v, want ErrShortSecret", s, err)
		}
	}
	if _, err := DeriveCA(secretA[:MinDeriveSecret], "replicated"); err != nil {
		t.Errorf("DeriveCA of %d bytes: %v", MinDeriveSecret, err)
	}
}

// A node certificate one replica issued is one the other accepts, and the
// coordinator's certificate of one passes the other's pin.
func TestDerivedCAsIssueForEachOther(t *testing.T) {
	ca1, ca2 := deriveCA(t, secretA), deriveCA(t, secretA)
	key, csr, err := NewNodeKey()
	if err != nil {
		t.Fatal(err)
	}
	der, err := ca1.IssueNode("node-4", csr)
	if err != nil {
		t.Fatal(err)
	}
	node, _ := x509.ParseCertificate(der)
	if _, err := node.Verify(x509.VerifyOptions{Roots: ca2.Pool(), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Errorf("a node certificate of one replica, verified by the other: %v", err)
	}
	if _, err := node.Verify(x509.VerifyOptions{Roots: deriveCA(t, secretB).Pool(), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err == nil {
		t.Error("another token's CA accepted the node certificate")
	}

	// A full handshake: the coordinator's certificate from ca1, the
	// joiner pinning ca2's hash and presenting the node certificate, which
	// ca1's server configuration verifies.
	srv, err := ca1.ServerCertificate([]string{"127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	nodeCert := NodeCertificate(der, key)
	client, err := Trust{CAHash: ca2.Hash()}.Config(&nodeCert)
	if err != nil {
		t.Fatal(err)
	}
	st, serverErr, clientErr := handshake(t, ServerConfig(srv, ca1), client)
	if serverErr != nil || clientErr != nil {
		t.Fatalf("handshake: server %v, client %v", serverErr, clientErr)
	}
	if len(st.PeerCertificates) == 0 || NodeID(st.PeerCertificates[0]) != "node-4" || len(st.VerifiedChains) == 0 {
		t.Errorf("the server saw %d certificates, %d verified chains; want node-4's, verified", len(st.PeerCertificates), len(st.VerifiedChains))
	}
}

// Among replicas, only replica certificates of the job's CA pass, on
// either side; node certificates and the coordinator's certificate of the
// same CA are refused, by the replica-certificate check itself.
func TestReplicaTLS(t *testing.T) {
	ca, other := deriveCA(t, secretA), deriveCA(t, secretB)
	replica := func(ca *CA, name string) tls.Certificate {
		c, err := ca.ReplicaCertificate(name, []string{"10.0.0.1", "0.0.0.0", "host1"})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	r1, r2, stranger := replica(ca, "replica-1"), replica(ca, "replica-2"), replica(other, "replica-1")
	coord, err := ca.ServerCertificate(nil)
	if err != nil {
		t.Fatal(err)
	}
	key, csr, _ := NewNodeKey()
	der, err := ca.IssueNode("node-1", csr)
	if err != nil {
		t.Fatal(err)
	}
	node := NodeCertificate(der, key)

	const (
		notReplica = "is not a coordinator replica"
		notOurCA   = "not of this job's CA"
		noCert     = "didn't provide a certificate"
	)
	for _, tc := range []struct {
		name           string
		server, client tls.Certificate
		noClientCert   bool
		serverRefuses  string // what the server's error says, "" when it accepts
		clientRefuses  string
	}{
		{name: "replicas", server: r1, client: r2},
		{name: "node as client", server: r1, client: node, serverRefuses: notReplica},
		{name: "coordinator as client", server: r1, client: coord, serverRefuses: notReplica},
		{name: "no client certificate", server: r1, noClientCert: true, serverRefuses: noCert},
		{name: "another job's replica as client", server: r1, client: stranger, serverRefuses: notOurCA},
		{name: "coordinator as server", server: coord, client: r2, clientRefuses: notReplica},
		{name: "node as server", server: node, client: r2, clientRefuses: notReplica},
		{name: "another job's replica as server", server: stranger, client: r2, clientRefuses: notOurCA},
	} {
		t.Run(tc.name, func(t *testing.T) {
			serverConf, _ := ReplicaTLS(ca, tc.server)
			_, clientConf := ReplicaTLS(ca, tc.client)
			if tc.noClientCert {
				clientConf.Certificates = nil
			}
			st, serverErr, clientErr := handshake(t, serverConf, clientConf)
			switch {
			case tc.serverRefuses == "" && tc.clientRefuses == "":
				if serverErr != nil || clientErr != nil {
					t.Fatalf("server %v, client %v; want a connection", serverErr, clientErr)
				}
				if got := ReplicaName(st.PeerCertificates[0]); got != "replica-2" {
					t.Errorf("the server saw replica %q, want replica-2", got)
				}
			case tc.serverRefuses != "":
				if serverErr == nil || !strings.Contains(serverErr.Error(), tc.serverRefuses) || clientErr == nil {
					t.Errorf("server %v, client %v; want the server to refuse: %s", serverErr, clientErr, tc.serverRefuses)
				}
			default:
				if clientErr == nil || !strings.Contains(clientErr.Error(), tc.clientRefuses) || serverErr == nil {
					t.Errorf("server %v, client %v; want the client to refuse: %s", serverErr, clientErr, tc.clientRefuses)
				}
			}
		})
	}
}

func TestReplicaCertificate(t *testing.T) {
	ca := deriveCA(t, secretA)
	c, err := ca.ReplicaCertificate("replica-3", []string{"10.0.0.3", "host3"})
	if err != nil {
		t.Fatal(err)
	}
	leaf, _ := x509.ParseCertificate(c.Certificate[0])
	if ReplicaName(leaf) != "replica-3" || NodeID(leaf) != "" {
		t.Errorf("ReplicaName %q, NodeID %q; want replica-3, none", ReplicaName(leaf), NodeID(leaf))
	}
	for _, u := range []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth} {
		if _, err := leaf.Verify(x509.VerifyOptions{Roots: ca.Pool(), KeyUsages: []x509.ExtKeyUsage{u}, DNSName: "host3"}); err != nil {
			t.Errorf("usage %v: %v", u, err)
		}
	}
	if _, err := ca.ReplicaCertificate("", nil); err == nil {
		t.Error("a replica certificate without a name")
	}
}

// handshake runs a TLS handshake over loopback TCP; the server writes one
// byte after its handshake, so that the client learns of a refusal of its
// certificate (in TLS 1.3 the client's handshake ends first). st is the
// server's view.
func handshake(t *testing.T, server, client *tls.Config) (st tls.ConnectionState, serverErr, clientErr error) {
	t.Helper()
	lis, err := tls.Listen("tcp", "127.0.0.1:0", server)
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	done := make(chan struct{})
	go func() {
		defer close(done)
		c, err := lis.Accept()
		if err != nil {
			serverErr = err
			return
		}
		defer c.Close()
		tc := c.(*tls.Conn)
		_ = tc.SetDeadline(time.Now().Add(10 * time.Second))
		if serverErr = tc.HandshakeContext(t.Context()); serverErr == nil {
			st = tc.ConnectionState()
			_, serverErr = tc.Write([]byte{1})
		}
	}()
	d := &net.Dialer{Timeout: 10 * time.Second}
	c, err := tls.DialWithDialer(d, "tcp", lis.Addr().String(), client)
	if err == nil {
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		_, err = c.Read(make([]byte, 1))
		c.Close()
	}
	<-done
	return st, serverErr, err
}
