package jobtls

import (
	"crypto/tls"
	"crypto/x509"
	"net"
	"strings"
	"testing"
	"time"
)

func newCA(t *testing.T) *CA {
	t.Helper()
	ca, err := NewCA("test")
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

// A CA handed over (MarshalCA, ParseCA) is the same CA: its node
// certificates verify under the original, its hash is the same, and a
// key that is not the certificate's is refused.
func TestMarshalCA(t *testing.T) {
	ca := newCA(t)
	cert, key, err := ca.MarshalCA()
	if err != nil {
		t.Fatal(err)
	}
	got, err := ParseCA(cert, key)
	if err != nil {
		t.Fatal(err)
	}
	if got.Hash() != ca.Hash() {
		t.Errorf("hash %s, want %s", got.Hash(), ca.Hash())
	}
	_, csr, _ := NewNodeKey()
	der, err := got.IssueNode("node-2", csr)
	if err != nil {
		t.Fatal(err)
	}
	node, _ := x509.ParseCertificate(der)
	if _, err := node.Verify(x509.VerifyOptions{Roots: ca.Pool(), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Errorf("a node certificate of the handed-over CA, under the original: %v", err)
	}
	_, otherKey, _ := newCA(t).MarshalCA()
	if _, err := ParseCA(cert, otherKey); err == nil {
		t.Error("ParseCA took another CA's key for this certificate")
	}
	sig, err := ca.Sign([]byte("leader 10.0.0.1:29400"))
	if err != nil {
		t.Fatal(err)
	}
	if err := VerifySigned(got.Cert, []byte("leader 10.0.0.1:29400"), sig); err != nil {
		t.Errorf("VerifySigned: %v", err)
	}
	if err := VerifySigned(got.Cert, []byte("leader 10.6.6.6:29400"), sig); err == nil {
		t.Error("a signature verified for another message")
	}
	if err := VerifySigned(newCA(t).Cert, []byte("leader 10.0.0.1:29400"), sig); err == nil {
		t.Error("a signature verified under another CA")
	}
}

// Among replicas, only replica certificates of the job's CA pass, on
// either side; node certificates and the coordinator's certificate of the
// same CA are refused, by the replica-certificate check itself.
func TestReplicaTLS(t *testing.T) {
	ca, other := newCA(t), newCA(t)
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
	ca := newCA(t)
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
