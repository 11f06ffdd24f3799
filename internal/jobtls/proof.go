package jobtls

// The proof of the job token: every TLS connection to the
// coordinator proves, both ways, that each side holds the job token, and
// the token itself never travels. Right after the TLS handshake, on the
// TLS connection, before any gRPC byte:
//
//	client → server: "GTP1" HMAC-SHA256(token, "gotrain client" ‖ EKM)
//	server → client: "GTOK" HMAC-SHA256(token, "gotrain server" ‖ EKM)
//	                 (or "GTNO" and the connection closed: a wrong proof)
//
// EKM is the session's exported keying material (RFC 8446 §7.5), which
// both ends of one TLS session share and no other session has: a fake
// server (or one in the middle, which holds two sessions) learns a proof
// it cannot replay anywhere, and cannot answer one without the token. The
// client checks the server's proof before it sends anything else, then
// checks the CA pin (Trust.CAHash): a server that proves the token but
// presents another CA is this job's coordinator restarted with a new
// identity (ErrNewIdentity), which no pin mismatch of a stranger is.
//
// A proof is an offline oracle for the token to whoever receives one
// (guess a token, compare): gotrain's tokens are 16 random bytes, which
// no guessing reaches; a short token of one's own is as weak as it looks.

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
)

const (
	proofLabel   = "EXPORTER-gotrain-job-token-proof-v1"
	proofLen     = sha256.Size
	clientMagic  = "GTP1"
	serverOK     = "GTOK"
	serverRefuse = "GTNO"
)

// Errors of the proof, as a client sees them.
var (
	// ErrNoProof: the server did not prove the job token: it is not this
	// job's coordinator (or the token given here is not the job's).
	ErrNoProof = errors.New("jobtls: the server does not prove the job token")
	// ErrProofRefused: the coordinator refused this side's proof: the job
	// token given here is not the job's.
	ErrProofRefused = errors.New("jobtls: the coordinator refused this node's proof of the job token")
	// ErrNewIdentity: the server proves the job token but presents another
	// CA than the pinned one: a coordinator of this job restarted since
	// the pin was taken, with a new random CA.
	ErrNewIdentity = errors.New("jobtls: the coordinator restarted with a new identity")
)

// IdentityError is ErrNewIdentity with the hashes.
type IdentityError struct{ Addr, Was, Now string }

func (e *IdentityError) Error() string {
	return fmt.Sprintf("jobtls: the coordinator at %s restarted with a new identity (CA hash %s, was %s): the job cannot continue; restart the job", e.Addr, e.Now, e.Was)
}
func (e *IdentityError) Unwrap() error { return ErrNewIdentity }

func proofOf(tok, role string, ekm []byte) []byte {
	m := hmac.New(sha256.New, []byte(tok))
	m.Write([]byte(role))
	m.Write(ekm)
	return m.Sum(nil)
}

// Proven is a connection's AuthInfo once both sides proved the job token:
// the TLS state, and (client side) the pin of the CA the server presented.
type Proven struct {
	credentials.TLSInfo
	// Pin is the hash of the CA that issued the server's certificate (its
	// own hash when the chain holds no CA): what a joiner that had no pin
	// pins from then on. Client side only.
	Pin string
}

// ProvenPeer is the TLS state of ctx's caller (a gRPC server handler's
// context) when its connection proved the job token: the one place where
// a connection is found authenticated.
func ProvenPeer(ctx context.Context) (*tls.ConnectionState, bool) {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return nil, false
	}
	pr, ok := p.AuthInfo.(Proven)
	if !ok {
		return nil, false
	}
	return &pr.State, true
}

// ServerCredentials are the coordinator's transport credentials: TLS as
// conf says, then the proof of tok (see the top of this file). A client
// that fails the proof is closed before any gRPC call.
func ServerCredentials(conf *tls.Config, tok string) credentials.TransportCredentials {
	return &proofCreds{TransportCredentials: credentials.NewTLS(conf), tok: tok, server: true}
}

// proofCreds wraps TLS credentials with the proof. want (client side) is
// the pin checked after the proof ("" for none).
type proofCreds struct {
	credentials.TransportCredentials
	tok, want string
	server    bool
}

func (p *proofCreds) Clone() credentials.TransportCredentials {
	return &proofCreds{TransportCredentials: p.TransportCredentials.Clone(), tok: p.tok, want: p.want, server: p.server}
}

// session is one TLS connection between its handshake and the proof.
type session struct {
	conn net.Conn
	ti   credentials.TLSInfo
	ekm  []byte // the session's exported keying material the proofs are bound to
}

// afterTLS is the prologue both sides' handshakes share: the TLS
// handshake's result (conn, info, err) and the session's keying material.
// A connection that is not TLS, or whose keying material cannot be
// exported, is closed.
func afterTLS(conn net.Conn, info credentials.AuthInfo, err error) (*session, error) {
	if err != nil {
		return nil, err
	}
	s := &session{conn: conn}
	ti, ok := info.(credentials.TLSInfo)
	if !ok {
		_ = conn.Close()
		return nil, fmt.Errorf("jobtls: the connection is not TLS (%T)", info)
	}
	s.ti = ti
	if s.ekm, err = ti.State.ExportKeyingMaterial(proofLabel, nil, proofLen); err != nil {
		_ = conn.Close()
		return nil, fmt.Errorf("jobtls: the TLS session's keying material: %w", err)
	}
	return s, nil
}

// fail closes the connection and returns err as a handshake's result.
func (s *session) fail(err error) (net.Conn, credentials.AuthInfo, error) {
	_ = s.conn.Close()
	return nil, nil, err
}

func (p *proofCreds) ServerHandshake(raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	s, err := afterTLS(p.TransportCredentials.ServerHandshake(raw))
	if err != nil {
		return nil, nil, err
	}
	conn, ti, ekm, fail := s.conn, s.ti, s.ekm, s.fail
	// gRPC's connection timeout (a deadline on raw) bounds the read.
	got := make([]byte, len(clientMagic)+proofLen)
	if _, err := io.ReadFull(conn, got); err != nil {
		return fail(fmt.Errorf("jobtls: the client sent no proof of the job token: %w", err))
	}
	if string(got[:len(clientMagic)]) != clientMagic || !hmac.Equal(got[len(clientMagic):], proofOf(p.tok, "gotrain client", ekm)) {
		_, _ = conn.Write([]byte(serverRefuse))
		return fail(errors.New("jobtls: the client's proof of the job token is wrong: it does not hold this job's token"))
	}
	if _, err := conn.Write(append([]byte(serverOK), proofOf(p.tok, "gotrain server", ekm)...)); err != nil {
		return fail(err)
	}
	return conn, Proven{TLSInfo: ti}, nil
}

func (p *proofCreds) ClientHandshake(ctx context.Context, authority string, raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	s, err := afterTLS(p.TransportCredentials.ClientHandshake(ctx, authority, raw))
	if err != nil {
		return nil, nil, err
	}
	conn, ti, ekm, fail := s.conn, s.ti, s.ekm, s.fail
	if d, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(d)
		defer conn.SetDeadline(time.Time{})
	}
	if _, err := conn.Write(append([]byte(clientMagic), proofOf(p.tok, "gotrain client", ekm)...)); err != nil {
		return fail(fmt.Errorf("%w (%s: %v)", ErrNoProof, authority, err))
	}
	got := make([]byte, len(serverOK)+proofLen)
	n, err := io.ReadFull(conn, got)
	proven := err == nil && string(got[:len(serverOK)]) == serverOK && hmac.Equal(got[len(serverOK):], proofOf(p.tok, "gotrain server", ekm))
	mismatch := p.want != "" && verifyPinned(rawChain(ti.State.PeerCertificates), p.want) != nil
	switch {
	case !proven && mismatch:
		return fail(p.noProof(authority, ti.State.PeerCertificates)) // another coordinator, not this job's restarted
	case n >= len(serverRefuse) && string(got[:len(serverRefuse)]) == serverRefuse:
		return fail(fmt.Errorf("%w at %s: the job token given here is not the job's (check %s or --job-token-file), or someone in the middle relays this connection", ErrProofRefused, authority, "GOTRAIN_JOB_TOKEN"))
	case !proven:
		return fail(p.noProof(authority, ti.State.PeerCertificates))
	}
	pin := chainPin(ti.State.PeerCertificates)
	if mismatch {
		return fail(&IdentityError{Addr: authority, Was: p.want, Now: pin})
	}
	return conn, Proven{TLSInfo: ti, Pin: pin}, nil
}

// noProof is the error of a server that did not prove the token: a CA
// mismatch too when a pin was given (another coordinator, or someone in
// the middle), else ErrNoProof.
func (p *proofCreds) noProof(addr string, certs []*x509.Certificate) error {
	if p.want != "" {
		if err := verifyPinned(rawChain(certs), p.want); err != nil {
			return fmt.Errorf("%w; and it does not prove the job token either: it is not this job's coordinator", err)
		}
	}
	return fmt.Errorf("%w: the server at %s is not this job's coordinator (another job's, or someone posing as it), or the job token given here is not the job's; nothing it could use was sent", ErrNoProof, addr)
}

func rawChain(certs []*x509.Certificate) [][]byte {
	raw := make([][]byte, len(certs))
	for i, c := range certs {
		raw[i] = c.Raw
	}
	return raw
}

// chainPin is the pin of the CA in certs that issued the leaf (certs[0])
// for the coordinator (ServerName, server authentication): a job CA. For
// any other chain (a site's certificate) it is the leaf's own pin, which
// verifyPinned accepts as it is.
func chainPin(certs []*x509.Certificate) string {
	if len(certs) == 0 {
		return ""
	}
	raw := rawChain(certs)
	for _, c := range certs[1:] {
		if c.IsCA && verifyPinned(raw, Hash(c)) == nil {
			return Hash(c)
		}
	}
	return Hash(certs[0])
}
