// Package jobtls makes and checks a job's TLS credentials: the job CA that
// the node starting the coordinator makes in memory (a replicated
// coordinator's replicas hand it to one another, with ReplicaTLS for
// their own traffic), the proof of the job token that every connection
// makes both ways (proof.go), the coordinator's
// server certificate, each node's client certificate (its identity), and
// the client side's trust in the coordinator — a pin on the CA's public key
// (as kubeadm's --discovery-token-ca-cert-hash), a CA file of the site's
// own PKI, or, only when asked, none.
//
// # Usage
//
//	ca, _ := jobtls.NewCA("gotrain-1a2b3c4d")
//	srv, _ := ca.ServerCertificate([]string{"10.0.0.1", "node1"})
//	conf := jobtls.ServerConfig(srv, ca)       // the coordinator
//	fmt.Println("--ca-hash", ca.Hash())        // what a joiner is given
//
//	key, csr, _ := jobtls.NewNodeKey()          // a joining agent
//	t := jobtls.Trust{CAHash: hash}
//	creds, _ := t.Credentials(tok, nil)         // Join: token proof, pinned, no client cert
//	// ... Join sends csr, gets der = ca.IssueNode(nodeID, csr)
//	cert := jobtls.NodeCertificate(der, key)
//	creds, _ = t.Credentials(tok, &cert)        // every later call: mTLS
//	// the coordinator: grpc.Creds(jobtls.ServerCredentials(conf, tok))
package jobtls

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"strings"
	"time"

	"google.golang.org/grpc/credentials"
)

// ServerName is the DNS name every coordinator certificate of a job CA
// carries, and the name a joiner verifies it by: a joiner that reaches the
// coordinator by an IP or a name the certificate does not list still
// verifies it.
const ServerName = "gotrain-coordinator"

// nodeOU marks node certificates; a node certificate is for clients only
// (ExtKeyUsageClientAuth), so a node cannot pose as the coordinator.
const nodeOU = "gotrain node"

// validity is how long the job's certificates are valid: longer than any
// job, short enough that a stolen one does not outlive its use for long.
const validity = 90 * 24 * time.Hour

// Errors a joiner's check of the coordinator returns.
var (
	// ErrCAHashMismatch: the coordinator's chain holds no CA with the
	// pinned hash; it is another coordinator (or someone in the middle).
	ErrCAHashMismatch = errors.New("jobtls: the coordinator's CA does not match --ca-hash")
	// ErrNoTrust: Config without a CA hash, a CA file or SkipCheck (the
	// proof of the token, Credentials, needs none of them).
	ErrNoTrust = errors.New("jobtls: no way to verify the coordinator")
)

// CA is a job's certificate authority: a random key (ECDSA P-256) and a
// self-signed certificate, held in memory only (a replicated
// coordinator's replicas hand it to one another: MarshalCA, ParseCA).
type CA struct {
	Cert *x509.Certificate
	key  crypto.Signer
	pool *x509.CertPool
}

// NewCA makes a job CA named after the run.
func NewCA(runID string) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("make the job CA's key: %w", err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "gotrain job CA " + runID, Organization: []string{"gotrain"}},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(validity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	return selfSigned(tmpl, &key.PublicKey, key)
}

// selfSigned makes the CA of tmpl, signed by its own key.
func selfSigned(tmpl *x509.Certificate, pub crypto.PublicKey, key crypto.Signer) (*CA, error) {
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, pub, key)
	if err != nil {
		return nil, fmt.Errorf("make the job CA: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &CA{Cert: cert, key: key, pool: pool}, nil
}

// Pool is a pool holding only the CA.
func (ca *CA) Pool() *x509.CertPool { return ca.pool }

// Hash is the CA's pin: "sha256:" and the hex SHA-256 of its
// SubjectPublicKeyInfo, as kubeadm's --discovery-token-ca-cert-hash.
func (ca *CA) Hash() string { return Hash(ca.Cert) }

// Hash is cert's pin: "sha256:" and the hex SHA-256 of its
// SubjectPublicKeyInfo.
func Hash(cert *x509.Certificate) string {
	sum := sha256.Sum256(cert.RawSubjectPublicKeyInfo)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// CheckHash says whether h is a well-formed pin ("sha256:" and 64 hex
// digits), and when not, what is wrong with it: an elided example copied
// as it is (sha256:5f0c…), a missing prefix, a wrong length.
func CheckHash(h string) error {
	hx, ok := strings.CutPrefix(h, "sha256:")
	var why string
	switch {
	case strings.Contains(h, "…") || strings.Contains(h, "..."):
		why = "it is cut short (…): that is an elided example, not a hash"
	case !ok:
		why = `it does not start with "sha256:"`
	case strings.Trim(hx, "0123456789abcdefABCDEF") != "":
		why = "it holds characters that are not hex digits"
	case len(hx) != 2*sha256.Size:
		why = fmt.Sprintf("it has %d hex digits, not %d", len(hx), 2*sha256.Size)
	default:
		if _, err := hex.DecodeString(hx); err != nil {
			why = err.Error()
		}
	}
	if why != "" {
		return fmt.Errorf("--ca-hash %q: %s (want sha256: and 64 hex digits)", h, why)
	}
	return nil
}

// LoadCAFile reads a CA file (--tls-ca): a regular file holding one or
// more PEM certificates, every one of which must parse.
func LoadCAFile(path string) (*x509.CertPool, error) {
	b, err := readRegular("--tls-ca", path)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	n := 0
	for rest := b; ; {
		var blk *pem.Block
		if blk, rest = pem.Decode(rest); blk == nil {
			break
		}
		if blk.Type != "CERTIFICATE" {
			continue
		}
		c, err := x509.ParseCertificate(blk.Bytes)
		if err != nil {
			return nil, fmt.Errorf("--tls-ca %s: certificate %d: %w", path, n+1, err)
		}
		pool.AddCert(c)
		n++
	}
	if n == 0 {
		return nil, fmt.Errorf("--tls-ca %s holds no PEM certificate (a file that starts with -----BEGIN CERTIFICATE-----)", path)
	}
	return pool, nil
}

// readRegular reads a file that flag names, refusing what is not a
// regular file (a directory, a device) with a message that names both.
func readRegular(flag, path string) ([]byte, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", flag, err)
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("%s %s is not a regular file (mode %s)", flag, path, st.Mode())
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", flag, err)
	}
	return b, nil
}

// ServerCertificate issues the coordinator's certificate for ServerName,
// localhost and hosts (IP addresses and names; unspecified addresses such
// as 0.0.0.0 are left out).
func (ca *CA) ServerCertificate(hosts []string) (tls.Certificate, error) {
	tmpl := ca.leaf(pkix.Name{CommonName: ServerName}, x509.ExtKeyUsageServerAuth)
	tmpl.DNSNames = []string{ServerName, "localhost"}
	tmpl.IPAddresses = []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}
	return ca.issueFor(tmpl, hosts, "the coordinator's certificate")
}

// issueFor issues tmpl, valid also for hosts (IP addresses and names;
// unspecified addresses such as 0.0.0.0 are left out), with a new key:
// a certificate whose chain carries the CA, so that a peer can find the
// pinned key in it. what names it in errors.
func (ca *CA) issueFor(tmpl *x509.Certificate, hosts []string, what string) (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, err
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			if !ip.IsUnspecified() {
				tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
			}
		} else if h != "" {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.key)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("jobtls: issue %s: %w", what, err)
	}
	return tls.Certificate{Certificate: [][]byte{der, ca.Cert.Raw}, PrivateKey: key}, nil
}

// IssueNode issues node nodeID's client certificate for the key of csrDER
// (a PKCS #10 request, DER): CN = nodeID, client authentication only. The
// request's subject is ignored; its signature must hold.
func (ca *CA) IssueNode(nodeID string, csrDER []byte) ([]byte, error) {
	csr, err := x509.ParseCertificateRequest(csrDER)
	if err != nil {
		return nil, fmt.Errorf("jobtls: certificate request: %w", err)
	}
	if err := csr.CheckSignature(); err != nil {
		return nil, fmt.Errorf("jobtls: certificate request: %w", err)
	}
	tmpl := ca.leaf(pkix.Name{CommonName: nodeID, OrganizationalUnit: []string{nodeOU}}, x509.ExtKeyUsageClientAuth)
	tmpl.DNSNames = []string{nodeID}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, csr.PublicKey, ca.key)
	if err != nil {
		return nil, fmt.Errorf("jobtls: issue node %s's certificate: %w", nodeID, err)
	}
	return der, nil
}

func (ca *CA) leaf(subject pkix.Name, usage x509.ExtKeyUsage) *x509.Certificate {
	now := time.Now()
	return &x509.Certificate{
		SerialNumber: serial(),
		Subject:      subject,
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(validity),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{usage},
	}
}

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	return n
}

// NodeID is the node a verified client certificate names, "" when cert is
// not a node certificate.
func NodeID(cert *x509.Certificate) string {
	for _, ou := range cert.Subject.OrganizationalUnit {
		if ou == nodeOU {
			return cert.Subject.CommonName
		}
	}
	return ""
}

// NewNodeKey makes a joining node's key and a certificate request for it
// (DER), to send in Join.
func NewNodeKey() (crypto.Signer, []byte, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	csr, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: pkix.Name{CommonName: "gotrain node"}}, key)
	if err != nil {
		return nil, nil, fmt.Errorf("jobtls: certificate request: %w", err)
	}
	return key, csr, nil
}

// NodeCertificate pairs a node certificate from Join with its key.
func NodeCertificate(der []byte, key crypto.Signer) tls.Certificate {
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// ServerConfig is the coordinator's TLS configuration: cert, and client
// certificates verified against ca (the job CA, which issues node
// certificates) when a client presents one. Clients without one (a
// joining node, gotrain diagnose) still connect; the coordinator decides
// per call what needs a node's certificate.
func ServerConfig(cert tls.Certificate, ca *CA) *tls.Config {
	return &tls.Config{
		Certificates: []tls.Certificate{cert},
		ClientAuth:   tls.VerifyClientCertIfGiven,
		ClientCAs:    ca.Pool(),
		MinVersion:   tls.VersionTLS13,
	}
}

// LoadServerCertificate loads a site's certificate and key (PEM files):
// regular files, the key readable by no one but its owner (and its
// group), the key matching the certificate, the certificate valid now.
func LoadServerCertificate(certFile, keyFile string) (tls.Certificate, error) {
	certPEM, err := readRegular("--tls-cert", certFile)
	if err != nil {
		return tls.Certificate{}, err
	}
	keyPEM, err := readRegular("--tls-key", keyFile)
	if err != nil {
		return tls.Certificate{}, err
	}
	if st, err := os.Stat(keyFile); err == nil && st.Mode().Perm()&0o027 != 0 {
		return tls.Certificate{}, fmt.Errorf("--tls-key %s is readable or writable by other users (mode %#o): chmod 600 %s", keyFile, st.Mode().Perm(), keyFile)
	}
	if blk, _ := pem.Decode(certPEM); blk == nil || blk.Type != "CERTIFICATE" {
		return tls.Certificate{}, fmt.Errorf("--tls-cert %s holds no PEM certificate (a file that starts with -----BEGIN CERTIFICATE-----)", certFile)
	}
	if blk, _ := pem.Decode(keyPEM); blk == nil || !strings.HasSuffix(blk.Type, "PRIVATE KEY") {
		return tls.Certificate{}, fmt.Errorf("--tls-key %s holds no PEM private key (a file that starts with -----BEGIN PRIVATE KEY-----)", keyFile)
	}
	c, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return c, fmt.Errorf("--tls-cert %s and --tls-key %s: %w (is the key the certificate's?)", certFile, keyFile, err)
	}
	leaf, err := x509.ParseCertificate(c.Certificate[0])
	if err != nil {
		return c, fmt.Errorf("--tls-cert %s: %w", certFile, err)
	}
	if now := time.Now(); now.After(leaf.NotAfter) || now.Before(leaf.NotBefore) {
		return c, fmt.Errorf("--tls-cert %s is valid from %s to %s, not now", certFile, leaf.NotBefore.Format(time.RFC3339), leaf.NotAfter.Format(time.RFC3339))
	}
	return c, nil
}

// LeafHash is the pin of cert's leaf (its first certificate): what local
// tools (gotrain diagnose, top) pin when the coordinator presents a
// certificate of the site's PKI.
func LeafHash(cert tls.Certificate) (string, error) {
	if len(cert.Certificate) == 0 {
		return "", errors.New("jobtls: empty certificate")
	}
	c, err := x509.ParseCertificate(cert.Certificate[0])
	if err != nil {
		return "", err
	}
	return Hash(c), nil
}

// Trust is how a client verifies the coordinator. Every connection
// proves the job token both ways (proof.go), so the token itself never
// travels; besides, exactly one of these applies, in this order: CAFile
// (the site's PKI: normal verification of the address's name), CAHash (a
// pin on the job CA's key, or on the coordinator's own certificate,
// checked after the proof: ErrNewIdentity when the coordinator proves
// the token under another CA), none (the proof alone: whoever holds the
// token can pose as the coordinator to this client; a joiner pins the CA
// it found from then on). SkipCheck is kept for compatibility: it is the
// proof alone.
type Trust struct {
	CAHash    string `json:"ca_hash,omitempty"`
	CAFile    string `json:"ca_file,omitempty"`
	SkipCheck bool   `json:"skip_check,omitempty"`
}

// Credentials are gRPC transport credentials that verify the coordinator
// as t says and prove tok (ServerCredentials' other end), presenting
// client (a node certificate) when not nil.
func (t Trust) Credentials(tok string, client *tls.Certificate) (credentials.TransportCredentials, error) {
	conf, err := t.config(client, true)
	if err != nil {
		return nil, err
	}
	p := &proofCreds{TransportCredentials: credentials.NewTLS(conf), tok: tok}
	if t.CAFile == "" {
		p.want = t.CAHash
	}
	return p, nil
}

// Config is the client's TLS configuration without the proof of the
// token: the pin, when given, is checked in the handshake.
func (t Trust) Config(client *tls.Certificate) (*tls.Config, error) { return t.config(client, false) }

func (t Trust) config(client *tls.Certificate, proof bool) (*tls.Config, error) {
	conf := &tls.Config{MinVersion: tls.VersionTLS13}
	if client != nil {
		conf.Certificates = []tls.Certificate{*client}
	}
	switch {
	case t.CAFile != "":
		pool, err := LoadCAFile(t.CAFile)
		if err != nil {
			return nil, err
		}
		conf.RootCAs = pool
	case t.CAHash != "" && !proof:
		if err := CheckHash(t.CAHash); err != nil {
			return nil, err
		}
		want := t.CAHash
		// The pin replaces name-based verification (a joiner may reach the
		// coordinator by any address): VerifyPeerCertificate does it all,
		// during the handshake, before any request is written.
		conf.InsecureSkipVerify = true
		conf.VerifyPeerCertificate = func(raw [][]byte, _ [][]*x509.Certificate) error { return verifyPinned(raw, want) }
	case t.CAHash != "" || proof || t.SkipCheck:
		if t.CAHash != "" {
			if err := CheckHash(t.CAHash); err != nil {
				return nil, err
			}
		}
		// The proof of the token verifies the server (and the pin after
		// it): here, only that a CA in the chain issued the leaf for the
		// coordinator.
		conf.InsecureSkipVerify = true
		if !t.SkipCheck {
			conf.VerifyPeerCertificate = func(raw [][]byte, _ [][]*x509.Certificate) error { return verifyShape(raw) }
		}
	default:
		return nil, ErrNoTrust
	}
	return conf, nil
}

// verifyShape accepts any chain that parses: the proof of the token
// verifies the server, and the pin (chainPin) is taken from the chain
// after it.
func verifyShape(raw [][]byte) error {
	if len(raw) == 0 {
		return errors.New("jobtls: the coordinator sent no certificate")
	}
	for _, r := range raw {
		if _, err := x509.ParseCertificate(r); err != nil {
			return fmt.Errorf("jobtls: the coordinator's certificate: %w", err)
		}
	}
	return nil
}

// verifyPinned accepts the chain raw when a certificate in it has the pin
// want: the leaf itself, or a CA that issued the leaf for ServerName with
// server authentication (a node certificate of the same CA is refused).
func verifyPinned(raw [][]byte, want string) error {
	if len(raw) == 0 {
		return errors.New("jobtls: the coordinator sent no certificate")
	}
	certs := make([]*x509.Certificate, len(raw))
	for i, r := range raw {
		c, err := x509.ParseCertificate(r)
		if err != nil {
			return fmt.Errorf("jobtls: the coordinator's certificate: %w", err)
		}
		certs[i] = c
	}
	if pinned(certs[0], want) {
		return nil
	}
	for _, c := range certs[1:] {
		if !pinned(c, want) || !c.IsCA {
			continue
		}
		roots, mid := x509.NewCertPool(), x509.NewCertPool()
		roots.AddCert(c)
		for _, m := range certs[1:] {
			if m != c {
				mid.AddCert(m)
			}
		}
		_, err := certs[0].Verify(x509.VerifyOptions{Roots: roots, Intermediates: mid, DNSName: ServerName, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}})
		if err != nil {
			return fmt.Errorf("jobtls: the coordinator's certificate is not one the pinned CA issued for it: %w", err)
		}
		return nil
	}
	return fmt.Errorf("%w: --ca-hash is %s, but the coordinator presented %s: check the --ca-hash the first node printed; a different hash means another coordinator (another job's, or one restarted since), or someone in the middle", ErrCAHashMismatch, want, hashes(certs))
}

func pinned(c *x509.Certificate, want string) bool {
	return subtle.ConstantTimeCompare([]byte(Hash(c)), []byte(want)) == 1
}

// hashes names each certificate of a chain by its pin, the CAs first (the
// hash a first node prints is its CA's).
func hashes(certs []*x509.Certificate) string {
	var cas, leaves []string
	for _, c := range certs {
		if c.IsCA {
			cas = append(cas, fmt.Sprintf("%s (CA: %s)", Hash(c), c.Subject.CommonName))
		} else {
			leaves = append(leaves, fmt.Sprintf("%s (its certificate: %s)", Hash(c), c.Subject.CommonName))
		}
	}
	return strings.Join(append(cas, leaves...), ", ")
}

// PEM encodes cert.
func PEM(cert *x509.Certificate) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Raw})
}
