package jobtls

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/credentials"
)

// proofHandshake runs ServerCredentials(serverTok) against Trust t's
// Credentials(clientTok) over loopback TCP.
func proofHandshake(t testing.TB, ca *CA, serverTok string, trust Trust, clientTok string) (server, client credentials.AuthInfo, serverErr, clientErr error) {
	t.Helper()
	cert, err := ca.ServerCertificate([]string{"127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
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
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		var conn net.Conn
		conn, server, serverErr = ServerCredentials(ServerConfig(cert, ca), serverTok).ServerHandshake(c)
		if conn != nil {
			conn.Close()
		}
	}()
	creds, err := trust.Credentials(clientTok, nil)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := net.Dial("tcp", lis.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	conn, client, clientErr := creds.ClientHandshake(ctx, lis.Addr().String(), raw)
	if conn != nil {
		conn.Close()
	} else {
		raw.Close()
	}
	<-done
	return server, client, serverErr, clientErr
}

// The proof of the token, both ways, bound to the session: the same token
// passes and the client learns the CA to pin; a wrong token on either side
// fails on both; a pinned CA is checked after the proof, so that a server
// that proves the token under another CA is told apart (a new identity)
// from one that does not (another coordinator).
func TestProofOfToken(t *testing.T) {
	ca, _ := NewCA("job")
	other, _ := NewCA("other")
	const tok = "0123456789abcdef0123456789abcdef"

	srv, cli, serr, cerr := proofHandshake(t, ca, tok, Trust{}, tok)
	if serr != nil || cerr != nil {
		t.Fatalf("same token: server %v, client %v", serr, cerr)
	}
	if _, ok := srv.(Proven); !ok {
		t.Errorf("the server's AuthInfo is %T, not Proven", srv)
	}
	if p, ok := cli.(Proven); !ok || p.Pin != ca.Hash() {
		t.Errorf("the client's AuthInfo %T pins %v, want %s", cli, cli, ca.Hash())
	}

	_, _, serr, cerr = proofHandshake(t, ca, tok, Trust{}, "not-"+tok)
	if serr == nil || !errors.Is(cerr, ErrProofRefused) {
		t.Errorf("a client with another token: server %v, client %v; want both to fail, the client with ErrProofRefused", serr, cerr)
	}
	_, _, serr, cerr = proofHandshake(t, ca, "not-"+tok, Trust{CAHash: ca.Hash()}, tok)
	if serr == nil || cerr == nil {
		t.Errorf("a server with another token: server %v, client %v; want both to fail", serr, cerr)
	}

	_, _, _, cerr = proofHandshake(t, other, tok, Trust{CAHash: ca.Hash()}, tok)
	var ie *IdentityError
	if !errors.As(cerr, &ie) || ie.Was != ca.Hash() || ie.Now != other.Hash() || !strings.Contains(cerr.Error(), "restart the job") {
		t.Errorf("a server of the token under another CA: %v; want a new identity from %s to %s", cerr, ca.Hash(), other.Hash())
	}
	_, _, _, cerr = proofHandshake(t, other, "not-"+tok, Trust{CAHash: ca.Hash()}, tok)
	if !errors.Is(cerr, ErrCAHashMismatch) {
		t.Errorf("a stranger under another CA: %v; want a CA mismatch", cerr)
	}
}

// BenchmarkProofHandshake is one connection's TLS handshake and proof of
// the token, over loopback TCP.
func BenchmarkProofHandshake(b *testing.B) {
	ca, _ := NewCA("job")
	const tok = "0123456789abcdef0123456789abcdef"
	for b.Loop() {
		if _, _, serr, cerr := proofHandshake(b, ca, tok, Trust{CAHash: ca.Hash()}, tok); serr != nil || cerr != nil {
			b.Fatal(serr, cerr)
		}
	}
}
