package host

import (
	"bytes"
	"context"
	"github.com/gotrain/gotrain/internal/coordinator/job"
	"net"
	"sync"
	"testing"

	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/gotrain/gotrain/internal/coordinator"
	"github.com/gotrain/gotrain/internal/jobtls"
	"github.com/gotrain/gotrain/internal/token"
	gotrainv1 "github.com/gotrain/gotrain/proto/gotrain/v1"
)

// relay is a TCP proxy to target that keeps every byte crossing it, as
// someone on the path between an agent and the coordinator would.
type relay struct {
	addr string
	mu   sync.Mutex
	seen bytes.Buffer
}

func startRelay(t *testing.T, target string) *relay {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &relay{addr: lis.Addr().String()}
	var wg sync.WaitGroup
	t.Cleanup(func() { lis.Close(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			in, err := lis.Accept()
			if err != nil {
				return
			}
			out, err := net.Dial("tcp", target)
			if err != nil {
				in.Close()
				continue
			}
			copyTo := func(dst, src net.Conn) {
				defer wg.Done()
				buf := make([]byte, 32<<10)
				for {
					n, err := src.Read(buf)
					if n > 0 {
						r.mu.Lock()
						r.seen.Write(buf[:n])
						r.mu.Unlock()
						if _, werr := dst.Write(buf[:n]); werr != nil {
							break
						}
					}
					if err != nil {
						break
					}
				}
				dst.Close()
				src.Close()
			}
			wg.Add(2)
			go copyTo(out, in)
			go copyTo(in, out)
		}
	}()
	return r
}

// sawToken says whether tok crossed the relay as it would in HTTP/2
// headers: as is, or Huffman-coded (HPACK).
func (r *relay) sawToken(tok string) (bool, int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	b := r.seen.Bytes()
	return bytes.Contains(b, []byte(tok)) || bytes.Contains(b, hpack.AppendHuffmanString(nil, tok)), len(b)
}

// joinThrough joins the coordinator through relay r with creds.
func joinThrough(t *testing.T, r *relay, creds credentials.TransportCredentials) error {
	t.Helper()
	cc, err := grpc.NewClient(r.addr, grpc.WithTransportCredentials(creds), token.DialOption(testToken))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(t.Context(), rpcTimeout)
	defer cancel()
	c := gotrainv1.NewCoordinatorClient(cc)
	if _, err := c.Join(ctx, &gotrainv1.JoinRequest{Node: node("host-a"), Csr: csr(t)}); err != nil {
		return err
	}
	_, err = c.GetJobStatus(ctx, &gotrainv1.GetJobStatusRequest{})
	return err
}

// The control plane was plaintext, and a relay on the
// path read the job token out of the HTTP/2 headers. The control (a
// coordinator served without TLS, as every one was) shows the relay can
// read it; the coordinator host.Start runs is TLS, and a joiner that pins
// its CA by hash gets through the same relay with no token in the bytes.
func TestRelayCannotReadToken(t *testing.T) {
	t.Run("plaintext, as before: the relay reads the token", func(t *testing.T) {
		srv, err := coordinator.New(coordinator.Config{Job: job.Config{RunID: "run-test", Nodes: 2}, Token: testToken})
		if err != nil {
			t.Fatal(err)
		}
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() { done <- srv.Serve(ctx, lis) }()
		defer func() { cancel(); <-done }()
		r := startRelay(t, lis.Addr().String())
		if err := joinThrough(t, r, insecure.NewCredentials()); err != nil {
			t.Fatal(err)
		}
		if saw, n := r.sawToken(testToken); !saw {
			t.Fatalf("the relay did not find the token in %d plaintext bytes: the check cannot fail", n)
		}
	})
	t.Run("TLS pinned by the CA hash", func(t *testing.T) {
		cfg := testConfig()
		cfg.Nodes = 2
		c, err := Start(t.Context(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Stop()
		r := startRelay(t, c.Addr().String())
		creds, err := jobtls.Trust{CAHash: c.CAHash()}.Credentials(testToken, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := joinThrough(t, r, creds); err != nil {
			t.Fatalf("join through the relay: %v", err)
		}
		saw, n := r.sawToken(testToken)
		if saw {
			t.Errorf("the relay read the job token")
		}
		if n < 1000 {
			t.Errorf("only %d bytes crossed the relay", n)
		}
	})
}

// A coordinator presents a certificate of the job CA for
// jobtls.ServerName, whatever address a joiner uses; a joiner pinning
// another CA is refused during the handshake, before any call.
func TestPinnedJoinerRefusesAnotherCA(t *testing.T) {
	c, err := Start(t.Context(), testConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Stop()
	other, err := jobtls.NewCA("other")
	if err != nil {
		t.Fatal(err)
	}
	r := startRelay(t, c.Addr().String())
	creds, _ := jobtls.Trust{CAHash: other.Hash()}.Credentials(testToken, nil)
	err = joinThrough(t, r, creds)
	// The coordinator proves the token (it is this job's) but presents
	// another CA than the pinned one: a new identity.
	if err == nil || !bytes.Contains([]byte(err.Error()), []byte("restarted with a new identity")) {
		t.Errorf("join pinned to another CA: %v", err)
	}
	if saw, _ := r.sawToken(testToken); saw {
		t.Errorf("the token crossed")
	}
	if c.Pin() != c.CAHash() || jobtls.CheckHash(c.CAHash()) != nil {
		t.Errorf("pin %q, CA hash %q", c.Pin(), c.CAHash())
	}
}
