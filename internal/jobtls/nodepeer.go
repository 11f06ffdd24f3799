package jobtls

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"

	"google.golang.org/grpc/credentials"
)

// NodePeerTLS are the TLS configurations of traffic between the job's
// agents (the in-memory snapshot tier's replicas): mutual TLS 1.3
// in which each side presents its node certificate (from Join) and accepts
// only a node certificate that ca, the job CA, issued. Agents cannot issue
// server certificates, so a node certificate (client authentication only)
// serves both ends here, checked by VerifyConnection instead of by the
// server name (agents dial one another by IP). want, when not "", is the
// node a client expects to reach. Wrap them in ServerCredentials and
// Trust-less client credentials (PeerCredentials) for the proof of the job
// token on top.
func NodePeerTLS(ca *x509.Certificate, cert tls.Certificate) (server *tls.Config, client func(want string) *tls.Config) {
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	server = &tls.Config{
		Certificates: []tls.Certificate{cert},
		MinVersion:   tls.VersionTLS13,
		ClientAuth:   tls.RequireAnyClientCert, // verified by VerifyConnection
		VerifyConnection: func(cs tls.ConnectionState) error {
			_, err := verifyNodePeer(pool, cs.PeerCertificates, "")
			return err
		},
	}
	client = func(want string) *tls.Config {
		return &tls.Config{
			Certificates:       []tls.Certificate{cert},
			MinVersion:         tls.VersionTLS13,
			InsecureSkipVerify: true, // VerifyConnection verifies, without the server name.
			VerifyConnection: func(cs tls.ConnectionState) error {
				_, err := verifyNodePeer(pool, cs.PeerCertificates, want)
				return err
			},
		}
	}
	return server, client
}

// verifyNodePeer accepts a leaf certificate that pool's CA issued as a node
// certificate (of node want, when not "") and returns its node.
func verifyNodePeer(pool *x509.CertPool, certs []*x509.Certificate, want string) (string, error) {
	if len(certs) == 0 {
		return "", errors.New("jobtls: the peer sent no certificate; only the job's agents may connect")
	}
	leaf := certs[0]
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		return "", fmt.Errorf("jobtls: the peer's certificate is not a node certificate of this job's CA (another job's agent?): %w", err)
	}
	node := NodeID(leaf)
	switch {
	case node == "":
		return "", fmt.Errorf("jobtls: the peer %q is not an agent of this job (its certificate is not a node certificate)", leaf.Subject.CommonName)
	case want != "" && node != want:
		return "", fmt.Errorf("jobtls: the peer is node %s, not node %s", node, want)
	}
	return node, nil
}

// PeerCredentials are a client's transport credentials for conf (from
// NodePeerTLS) with the proof of the job token tok: ServerCredentials'
// other end, without a pin (the node certificate stands for it).
func PeerCredentials(conf *tls.Config, tok string) credentials.TransportCredentials {
	return &proofCreds{TransportCredentials: credentials.NewTLS(conf), tok: tok}
}

// PeerNode is the node of a connection that NodePeerTLS's server
// configuration accepted: its VerifyConnection verified the leaf against
// the job CA (RequireAnyClientCert leaves VerifiedChains empty, so the leaf
// is read from PeerCertificates). "" when there is none.
func PeerNode(cs *tls.ConnectionState) string {
	if cs == nil || len(cs.PeerCertificates) == 0 {
		return ""
	}
	return NodeID(cs.PeerCertificates[0])
}
