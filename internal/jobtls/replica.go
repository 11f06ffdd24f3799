package jobtls

// A replicated coordinator's replicas are one job CA: agents pin one CA,
// and a node certificate that one replica issued must be accepted by the
// others after a leader change. The CA's key is random (NewCA), made by
// the first replica and handed to the others over an authenticated
// channel (MarshalCA, ParseCA): it is never derived from the job token,
// so a token holder cannot mint a certificate or sign a leader hint.
//
// The replicas' own traffic (Raft) uses replica certificates of that CA,
// with mutual TLS: ReplicaCertificate and ReplicaTLS.

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"slices"
)

// replicaOU marks replica certificates: only they pass ReplicaTLS.
const replicaOU = "gotrain replica"

// MarshalCA is ca's certificate and private key (PKCS #8), both DER: what
// a replica hands a new replica of the same set, over a channel that
// authenticated it. The key must go nowhere else.
func (ca *CA) MarshalCA() (cert, key []byte, err error) {
	key, err = x509.MarshalPKCS8PrivateKey(ca.key)
	if err != nil {
		return nil, nil, fmt.Errorf("jobtls: the job CA's key: %w", err)
	}
	return ca.Cert.Raw, key, nil
}

// ParseCA is the CA MarshalCA made: the certificate must be a CA whose
// public key is the key's.
func ParseCA(certDER, keyDER []byte) (*CA, error) {
	cert, err := x509.ParseCertificate(certDER)
	if err != nil {
		return nil, fmt.Errorf("jobtls: the job CA's certificate: %w", err)
	}
	k, err := x509.ParsePKCS8PrivateKey(keyDER)
	if err != nil {
		return nil, fmt.Errorf("jobtls: the job CA's key: %w", err)
	}
	key, ok := k.(crypto.Signer)
	if !ok || !cert.IsCA {
		return nil, errors.New("jobtls: the job CA handed over is not a CA with a signing key")
	}
	type equaler interface{ Equal(crypto.PublicKey) bool }
	if pub, ok := key.Public().(equaler); !ok || !pub.Equal(cert.PublicKey) {
		return nil, errors.New("jobtls: the job CA's key is not its certificate's")
	}
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &CA{Cert: cert, key: key, pool: pool}, nil
}

// Sign signs msg with the CA's key (what a replica vouches for: the
// leader hint). VerifySigned checks it against the CA's certificate.
func (ca *CA) Sign(msg []byte) ([]byte, error) {
	switch ca.key.(type) {
	case ed25519.PrivateKey:
		return ca.key.Sign(rand.Reader, msg, crypto.Hash(0))
	case *ecdsa.PrivateKey:
		sum := sha256.Sum256(msg)
		return ca.key.Sign(rand.Reader, sum[:], crypto.SHA256)
	}
	return nil, fmt.Errorf("jobtls: the job CA's key (%T) cannot sign", ca.key)
}

// VerifySigned checks that the key of the CA certificate ca signed msg
// (Sign).
func VerifySigned(ca *x509.Certificate, msg, sig []byte) error {
	algo := x509.ECDSAWithSHA256
	if _, ok := ca.PublicKey.(ed25519.PublicKey); ok {
		algo = x509.PureEd25519
	}
	if err := ca.CheckSignature(algo, msg, sig); err != nil {
		return fmt.Errorf("jobtls: not signed by the job CA %s: %w", Hash(ca), err)
	}
	return nil
}

// ReplicaCertificate issues a coordinator replica's certificate for the
// replicas' own traffic: CN name, for client and server authentication,
// valid for hosts (IP addresses and names) besides. Only certificates
// made by it pass ReplicaTLS.
func (ca *CA) ReplicaCertificate(name string, hosts []string) (tls.Certificate, error) {
	if name == "" {
		return tls.Certificate{}, errors.New("jobtls: a replica certificate needs the replica's name")
	}
	tmpl := ca.leaf(pkix.Name{CommonName: name, OrganizationalUnit: []string{replicaOU}}, x509.ExtKeyUsageServerAuth)
	tmpl.ExtKeyUsage = append(tmpl.ExtKeyUsage, x509.ExtKeyUsageClientAuth)
	return ca.issueFor(tmpl, hosts, "replica "+name+"'s certificate")
}

// ReplicaTLS are the TLS configurations of the replicas' traffic among
// themselves, presenting cert (from ReplicaCertificate): mutual TLS 1.3 in
// which each side accepts only a replica certificate of ca. Node
// certificates and the coordinator's server certificate of the same CA are
// refused. Replicas dial one another by IP, so the check of the
// replica certificate stands in for the server name's.
func ReplicaTLS(ca *CA, cert tls.Certificate) (server, client *tls.Config) {
	server = &tls.Config{
		Certificates: []tls.Certificate{cert},
		MinVersion:   tls.VersionTLS13,
		// Verified by VerifyConnection, which also checks the OU.
		ClientAuth: tls.RequireAnyClientCert,
		VerifyConnection: func(cs tls.ConnectionState) error {
			return verifyReplica(ca, cs.PeerCertificates, x509.ExtKeyUsageClientAuth)
		},
	}
	client = &tls.Config{
		Certificates:       []tls.Certificate{cert},
		MinVersion:         tls.VersionTLS13,
		InsecureSkipVerify: true, // VerifyConnection verifies, without the server name.
		VerifyConnection: func(cs tls.ConnectionState) error {
			return verifyReplica(ca, cs.PeerCertificates, x509.ExtKeyUsageServerAuth)
		},
	}
	return server, client
}

// verifyReplica accepts a peer whose leaf certificate ca issued as a
// replica certificate for usage.
func verifyReplica(ca *CA, certs []*x509.Certificate, usage x509.ExtKeyUsage) error {
	if len(certs) == 0 {
		return errors.New("jobtls: the peer sent no certificate; only the job's coordinator replicas may connect")
	}
	leaf := certs[0]
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: ca.Pool(), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
		return fmt.Errorf("jobtls: the peer's certificate is not of this job's CA (another job, or a replica started with another job token?): %w", err)
	}
	if ReplicaName(leaf) == "" {
		return fmt.Errorf("jobtls: the peer %q is not a coordinator replica of this job (its certificate is not a replica certificate)", leaf.Subject.CommonName)
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: ca.Pool(), KeyUsages: []x509.ExtKeyUsage{usage}}); err != nil {
		return fmt.Errorf("jobtls: replica %s's certificate: %w", leaf.Subject.CommonName, err)
	}
	return nil
}

// ReplicaName is the replica a verified certificate names, "" when cert is
// not a replica certificate.
func ReplicaName(cert *x509.Certificate) string {
	if slices.Contains(cert.Subject.OrganizationalUnit, replicaOU) {
		return cert.Subject.CommonName
	}
	return ""
}

// DeriveKey is a secret of purpose derived from the CA's private key
// (HMAC-SHA256 of its PKCS #8 form): the same on every replica of the set,
// which all hold the CA, and out of reach of anyone without the CA's key,
// the job token's holders included.
func (ca *CA) DeriveKey(purpose string) ([]byte, error) {
	_, key, err := ca.MarshalCA()
	if err != nil {
		return nil, err
	}
	m := hmac.New(sha256.New, key)
	m.Write([]byte("gotrain derived key\x00" + purpose))
	return m.Sum(nil), nil
}
