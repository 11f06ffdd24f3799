package launcher

import (
	"context"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"

	"github.com/gotrain/gotrain/internal/jobtls"
	"github.com/gotrain/gotrain/internal/token"
	gotrainv1 "github.com/gotrain/gotrain/proto/gotrain/v1"
)

// fakeCoordinator serves TLS with a CA of its own and keeps every job
// token a caller sends it, as an attacker answering at --coordinator would.
type fakeCoordinator struct {
	gotrainv1.UnimplementedCoordinatorServer
	addr   string
	mu     sync.Mutex
	tokens []string
	calls  int
}

func (f *fakeCoordinator) callCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls
}

func startFake(t *testing.T) *fakeCoordinator {
	t.Helper()
	ca, err := jobtls.NewCA("fake")
	if err != nil {
		t.Fatal(err)
	}
	cert, err := ca.ServerCertificate(nil)
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeCoordinator{}
	keep := func(ctx context.Context) {
		md, _ := metadata.FromIncomingContext(ctx)
		f.mu.Lock()
		f.calls++
		f.tokens = append(f.tokens, md.Get(token.MetadataKey)...)
		f.mu.Unlock()
	}
	s := grpc.NewServer(grpc.Creds(credentials.NewTLS(jobtls.ServerConfig(cert, ca))),
		grpc.UnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			keep(ctx)
			return h(ctx, req)
		}))
	gotrainv1.RegisterCoordinatorServer(s, f)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f.addr = lis.Addr().String()
	go s.Serve(lis)
	t.Cleanup(s.Stop)
	return f
}

func (f *fakeCoordinator) got() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.tokens...)
}

func joinerConfig(coord string, trust jobtls.Trust) Config {
	return Config{NprocPerNode: 1, Backend: "cpu", Program: "/bin/true", Coordinator: coord, Trust: trust,
		NodeAddress: "127.0.0.1", JoinTimeout: 20 * time.Second, Stdout: io.Discard, Stderr: io.Discard}
}

// A fake coordinator once received an agent's token
// (and then steered it). Every connection now proves the token both ways
// over its own TLS session, and the token itself never travels: a fake
// that holds no token gets no call, no token and nothing it can replay,
// with or without --ca-hash, and the agent refuses it at once.
func TestJoinerRefusesFakeCoordinator(t *testing.T) {
	real, err := jobtls.NewCA("real")
	if err != nil {
		t.Fatal(err)
	}
	const tok = "0123456789abcdef0123456789abcdef"
	for _, tc := range []struct {
		name  string
		trust jobtls.Trust
		want  []string
	}{
		{"--ca-hash of the real CA", jobtls.Trust{CAHash: real.Hash()}, []string{"nothing of the job token was sent", "does not match --ca-hash", "does not prove the job token"}},
		{"no --ca-hash: the proof alone", jobtls.Trust{}, []string{"nothing of the job token was sent", "does not prove the job token"}},
		{"--insecure-skip-ca-check: the proof still", jobtls.Trust{SkipCheck: true}, []string{"does not prove the job token"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fake := startFake(t)
			cfg := joinerConfig(fake.addr, tc.trust)
			cfg.JobToken = tok
			start := time.Now()
			err := Run(t.Context(), cfg)
			for _, w := range tc.want {
				if err == nil || !strings.Contains(err.Error(), w) {
					t.Errorf("Run against a fake coordinator: %v; want it to say %q", err, w)
				}
			}
			if d := time.Since(start); d > 15*time.Second {
				t.Errorf("refused after %v; a fake needs no retries", d)
			}
			if got, calls := fake.got(), fake.callCount(); len(got) > 0 || calls > 0 {
				t.Errorf("the fake coordinator got %d calls, tokens %q", calls, got)
			}
		})
	}
}

// TestConnectRetriesFast: the agent's connections try again at most a
// second apart, each attempt bounded well under the node timeout, so that
// a joiner started before its coordinator, or a node whose network heals,
// connects within about a second (gRPC's defaults: up to 2 minutes apart,
// 20 s an attempt).
func TestConnectRetriesFast(t *testing.T) {
	b := connectParams.Backoff
	if b.MaxDelay > time.Second || b.BaseDelay > b.MaxDelay || b.BaseDelay <= 0 {
		t.Errorf("connect back-off %+v: want at most 1 s between attempts", b)
	}
	if d := connectParams.MinConnectTimeout; d <= 0 || d > 5*time.Second {
		t.Errorf("connect attempt timeout %v: want a few seconds", d)
	}
}
