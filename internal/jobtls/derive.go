package jobtls

// A replicated coordinator's replicas start independently, on several
// hosts, yet must be one job CA: agents pin one --ca-hash, and a node
// certificate that one replica issued must be accepted by the others after
// a leader change. Rather than copy a private key between hosts, each
// replica derives the CA from the job token, which every replica holds
// already: the token is the job's root secret (whoever holds it can join
// as a node anyway).
//
// The cost: in a replicated job, a token holder can derive the CA key and
// mint node certificates, so per-node identity is only as strong as the
// token's secrecy (in a job with one coordinator, the CA key never leaves
// its memory). And the CA's public key, which every client sees and whose
// hash the join hint prints, lets anyone test guesses of the token offline,
// so DeriveCA refuses tokens shorter than MinDeriveSecret; gotrain's own
// tokens are 16 random bytes.
//
// The replicas' own traffic (Raft) uses replica certificates of the same
// CA, with mutual TLS: ReplicaCertificate and ReplicaTLS.

import (
	"crypto/ed25519"
	"crypto/hkdf"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"math/big"
	"slices"
	"time"
)

// MinDeriveSecret is the shortest secret (job token) DeriveCA accepts, in
// bytes.
const MinDeriveSecret = 16

// deriveLabel is HKDF's salt; the version lets a later derivation differ.
const deriveLabel = "gotrain job CA v1"

// replicaOU marks replica certificates: only they pass ReplicaTLS.
const replicaOU = "gotrain replica"

// A derived CA's validity is fixed, so that replicas that derive it at
// different times make the same certificate.
var (
	derivedNotBefore = time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	derivedNotAfter  = time.Date(2035, 1, 1, 0, 0, 0, 0, time.UTC)
)

// ErrShortSecret: the secret given to DeriveCA is shorter than
// MinDeriveSecret.
var ErrShortSecret = errors.New("jobtls: the job token is too short to derive the job CA from")

// DeriveCA is the job CA that every replica of a job's coordinator derives
// from secret (the job token): the same secret and name give the same
// certificate, byte for byte, and so the same Hash, in any process, on any
// host. Its key is Ed25519, from HKDF-SHA256 of secret; its validity is
// fixed (2025 to 2035). name goes into the subject and must be the same on
// every replica (a constant): node certificates name their issuer by it.
// Leaves (ServerCertificate, IssueNode, ReplicaCertificate) are ECDSA, as
// with NewCA. See the comment at the top of this file for what deriving
// costs.
func DeriveCA(secret, name string) (*CA, error) {
	if len(secret) < MinDeriveSecret {
		return nil, fmt.Errorf("%w: %d bytes, want at least %d (the CA hash would let anyone guess a shorter one offline); leave GOTRAIN_JOB_TOKEN unset to have gotrain make one, or use `openssl rand -hex 16`", ErrShortSecret, len(secret), MinDeriveSecret)
	}
	prk, err := hkdf.Extract(sha256.New, []byte(secret), []byte(deriveLabel))
	if err != nil {
		return nil, fmt.Errorf("derive the job CA: %w", err)
	}
	seed, err := hkdf.Expand(sha256.New, prk, deriveLabel+" key", ed25519.SeedSize)
	if err != nil {
		return nil, fmt.Errorf("derive the job CA: %w", err)
	}
	sn, err := hkdf.Expand(sha256.New, prk, deriveLabel+" serial", 16)
	if err != nil {
		return nil, fmt.Errorf("derive the job CA: %w", err)
	}
	key := ed25519.NewKeyFromSeed(seed)
	pub := key.Public().(ed25519.PublicKey)
	serial := new(big.Int).SetBytes(sn)
	serial.SetBit(serial, 127, 0) // below 2^127, as serial()
	if serial.Sign() == 0 {
		serial.SetInt64(1)
	}
	// The key id is set here, not left to crypto/x509, whose choice of
	// hash has changed between Go versions.
	skid := sha256.Sum256(pub)
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: "gotrain job CA " + name, Organization: []string{"gotrain"}},
		NotBefore:             derivedNotBefore,
		NotAfter:              derivedNotAfter,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
		SubjectKeyId:          skid[:20],
	}
	// Ed25519 signatures are deterministic: rand is not read.
	return selfSigned(tmpl, pub, key)
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
