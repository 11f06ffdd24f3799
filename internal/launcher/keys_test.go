package launcher

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"errors"
	"io"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc"

	"github.com/gotrain/gotrain/internal/coordinator/host"
	"github.com/gotrain/gotrain/internal/jobtls"
	"github.com/gotrain/gotrain/internal/leaderconn"
	"github.com/gotrain/gotrain/internal/netport"
	"github.com/gotrain/gotrain/internal/testing/testkit"
	gotrainv1 "github.com/gotrain/gotrain/proto/gotrain/v1"
)

const keysToken = "0123456789abcdef0123456789abcdef"

// startCoordinator runs a real coordinator of one node at listen.
func startCoordinator(t *testing.T, listen string) *host.Coordinator {
	t.Helper()
	return startCoordinatorCA(t, listen, nil)
}

// startCoordinatorCA is startCoordinator with the job CA ca (nil: a new
// one).
func startCoordinatorCA(t *testing.T, listen string, ca *jobtls.CA) *host.Coordinator {
	t.Helper()
	cfg := host.DefaultConfig()
	cfg.CA = ca
	cfg.JobToken, cfg.Listen, cfg.Nodes, cfg.NoGossip = keysToken, listen, 1, true
	cfg.NodeTimeout = 2 * time.Minute // far longer than a restart takes to be noticed
	c, err := host.Start(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Stop() })
	return c
}

// A joiner given no --ca-hash (Slurm's, torchrun lines,
// Kubernetes pods) verifies the coordinator by its proof of the token,
// and the job runs.
func TestJoinByProofOfTokenWithoutCAHash(t *testing.T) {
	c := startCoordinator(t, "127.0.0.1:0")
	cfg := joinerConfig(c.Addr().String(), jobtls.Trust{})
	cfg.JobToken = keysToken
	if err := Run(t.Context(), cfg); err != nil {
		t.Fatalf("a joiner without --ca-hash: %v", err)
	}
	if st := c.Status(); st.GetState() != "succeeded" {
		t.Errorf("the job is %q, want succeeded", st.GetState())
	}
}

// mitm terminates the joiner's TLS with a CA of its own and opens its own
// TLS session to the real coordinator, relaying the plaintext both ways
// and keeping it: someone in the middle who holds no token.
type mitm struct {
	addr string
	mu   sync.Mutex
	seen bytes.Buffer
}

func startMITM(t *testing.T, real string) *mitm {
	t.Helper()
	ca, err := jobtls.NewCA("mitm")
	if err != nil {
		t.Fatal(err)
	}
	cert, err := ca.ServerCertificate([]string{"127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	lis, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{cert}, NextProtos: []string{"h2"}, MinVersion: tls.VersionTLS13})
	if err != nil {
		t.Fatal(err)
	}
	m := &mitm{addr: lis.Addr().String()}
	var wg sync.WaitGroup
	t.Cleanup(func() { lis.Close(); wg.Wait() })
	wg.Go(func() {
		for {
			in, err := lis.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer in.Close()
				out, err := tls.Dial("tcp", real, &tls.Config{InsecureSkipVerify: true, NextProtos: []string{"h2"}, MinVersion: tls.VersionTLS13})
				if err != nil {
					return
				}
				defer out.Close()
				done := make(chan struct{}, 2)
				relay := func(dst, src net.Conn) {
					buf := make([]byte, 32<<10)
					for {
						n, err := src.Read(buf)
						if n > 0 {
							m.mu.Lock()
							m.seen.Write(buf[:n])
							m.mu.Unlock()
							if _, werr := dst.Write(buf[:n]); werr != nil {
								break
							}
						}
						if err != nil {
							break
						}
					}
					done <- struct{}{}
				}
				go relay(out, in)
				go relay(in, out)
				<-done
				in.Close()
				out.Close()
				<-done
			})
		}
	})
	return m
}

func (m *mitm) saw(tok string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	b := m.seen.Bytes()
	return bytes.Contains(b, []byte(tok)) || bytes.Contains(b, hpack.AppendHuffmanString(nil, tok))
}

// Someone in the middle without the token, relaying the proofs
// between two TLS sessions of its own, gets neither side to accept: each
// proof is bound to its session. It sees no token, the real coordinator
// admits no node, and the joiner is refused at once.
func TestMITMLearnsNoTokenAndIsRefused(t *testing.T) {
	c := startCoordinator(t, "127.0.0.1:0")
	m := startMITM(t, c.Addr().String())
	cfg := joinerConfig(m.addr, jobtls.Trust{})
	cfg.JobToken = keysToken
	err := Run(t.Context(), cfg)
	if err == nil {
		t.Fatal("a joiner joined through someone in the middle")
	}
	if m.saw(keysToken) {
		t.Error("the job token crossed the middle")
	}
	if n := len(c.Status().GetNodes()); n != 0 {
		t.Errorf("the real coordinator admitted %d nodes through the middle", n)
	}
	t.Logf("refused: %v", err)
}

// A standalone coordinator restarted after a crash has
// a new random CA. The agent says so plainly and stops at once: not a CA
// mismatch (an attack), not "the coordinator has lost this node", not
// after the node timeout.
func TestRestartedCoordinatorHasNewIdentity(t *testing.T) {
	// A port the kernel does not hand to connections by itself: a :0
	// port may be taken as some dial's local port between the stop and
	// the rebind (seen in CI with two suites running at once).
	port, err := netport.Unclaimed("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	first := startCoordinator(t, addr)
	cfg := joinerConfig(addr, jobtls.Trust{}) // pins the first CA at Join
	cfg.JobToken, cfg.Program, cfg.Args = keysToken, "/bin/sleep", []string{"600"}
	var stderr testkit.Buffer
	cfg.Stderr = &stderr
	errc := make(chan error, 1)
	go func() { errc <- Run(t.Context(), cfg) }()
	testkit.WaitFor(t, time.Minute, "the first coordinator running", func() bool { return first.Status().GetState() == "running" })
	wasHash := first.CAHash()
	if err := first.Stop(); err != nil {
		t.Fatal(err)
	}
	// The restart on the same address: a loaded machine may still hold the
	// first's socket for a moment after Stop (seen once beside stress-ng),
	// as a real restart would find it; try again for a while.
	var second *host.Coordinator
	testkit.WaitFor(t, 30*time.Second, "the second coordinator listening on "+addr, func() bool {
		cfg := host.DefaultConfig()
		cfg.JobToken, cfg.Listen, cfg.Nodes, cfg.NoGossip = keysToken, addr, 1, true
		cfg.NodeTimeout = 2 * time.Minute
		c, err := host.Start(t.Context(), cfg)
		if err != nil {
			if !errors.Is(err, syscall.EADDRINUSE) {
				t.Fatal(err)
			}
			time.Sleep(100 * time.Millisecond)
			return false
		}
		t.Cleanup(func() { _ = c.Stop() })
		second = c
		return true
	})
	if second.CAHash() == wasHash {
		t.Fatal("the restarted coordinator has the same CA: the test cannot fail")
	}
	select {
	case err = <-errc:
	case <-time.After(time.Minute): // the node timeout is 2 minutes
		t.Fatalf("the agent did not stop within a minute of the restart; it said:\n%s", stderr.String())
	}
	msg := ""
	if err != nil {
		msg = err.Error()
	}
	for _, w := range []string{"the coordinator at " + addr + " restarted with a new identity", "CA hash " + second.CAHash(), "was " + wasHash, "the job cannot continue; restart the job"} {
		if !strings.Contains(msg, w) {
			t.Errorf("the agent's error %q does not say %q", msg, w)
		}
	}
	for _, bad := range []string{"has lost this node", "does not match --ca-hash"} {
		if strings.Contains(msg, bad) {
			t.Errorf("the agent's error %q says %q", msg, bad)
		}
	}
	var ee *ExitError
	if !errors.As(err, &ee) || ee.Code == 0 {
		t.Errorf("the agent's error %v is not a non-zero exit", err)
	}
}

// hintServer is a coordinator that holds the token (a token holder can
// serve one) with a CA of its own: as a follower it names leader in every
// answer with proof, as the attacker's coordinator it counts the calls
// it gets.
type hintServer struct {
	gotrainv1.UnimplementedCoordinatorServer
	addr   string
	leader string
	proof  []string
	calls  atomic.Int32
}

func startHintServer(t *testing.T, leader string, proof ...string) *hintServer {
	t.Helper()
	ca, err := jobtls.NewCA("token holder")
	if err != nil {
		t.Fatal(err)
	}
	cert, err := ca.ServerCertificate([]string{"127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	h := &hintServer{leader: leader, proof: proof}
	s := grpc.NewServer(grpc.Creds(jobtls.ServerCredentials(jobtls.ServerConfig(cert, ca), keysToken)))
	gotrainv1.RegisterCoordinatorServer(s, h)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	h.addr = lis.Addr().String()
	go s.Serve(lis)
	t.Cleanup(s.Stop)
	return h
}

func (h *hintServer) GetJobStatus(ctx context.Context, _ *gotrainv1.GetJobStatusRequest) (*gotrainv1.JobStatus, error) {
	h.calls.Add(1)
	if h.leader != "" {
		return nil, leaderconn.NotLeader(ctx, h.addr, h.leader, h.proof...)
	}
	return &gotrainv1.JobStatus{State: "the attacker's"}, nil
}

// A token holder answering as a follower sent every agent to
// its own coordinator with a gotrain-leader hint. The agent believes a
// hint only when the replica set's CA signed it (leader and term): a
// forged, unsigned or stale one is ignored, and the call goes on to the
// real replicas; a signed one is followed.
func TestForgedLeaderHintIgnored(t *testing.T) {
	ca, err := jobtls.NewCA("real")
	if err != nil {
		t.Fatal(err)
	}
	signWith := func(_ *testing.T, _ *host.Coordinator, msg []byte) []byte {
		sig, err := ca.Sign(msg)
		if err != nil {
			t.Fatal(err)
		}
		return sig
	}
	real := startCoordinatorCA(t, "127.0.0.1:0", ca)
	attacker := startHintServer(t, "")
	mine, _ := jobtls.NewCA("mine")
	forgedSig, _ := mine.Sign(leaderconn.HintMessage(attacker.addr, 99))
	b64 := base64.StdEncoding.EncodeToString
	jobCA := ca.Cert
	staleSig := signWith(t, real, leaderconn.HintMessage(attacker.addr, 1))
	for _, tc := range []struct {
		name  string
		proof []string
	}{
		{"unsigned", nil},
		{"signed by another CA", []string{leaderconn.TermKey, "99", leaderconn.SigKey, b64(forgedSig)}},
		{"the job CA's signature of another term", []string{leaderconn.TermKey, "7", leaderconn.SigKey, b64(staleSig)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := attacker.calls.Load()
			follower := startHintServer(t, attacker.addr, tc.proof...)
			st := statusVia(t, jobCA, follower.addr, real.Addr().String())
			if st.GetState() == "the attacker's" || attacker.calls.Load() != before {
				t.Errorf("the agent followed a %s hint to the attacker", tc.name)
			}
			if follower.calls.Load() == 0 {
				t.Error("the call never reached the follower: the test cannot fail")
			}
		})
	}
	// The control: a hint the job CA signed is followed.
	t.Run("signed by the job CA", func(t *testing.T) {
		before := attacker.calls.Load()
		sig := signWith(t, real, leaderconn.HintMessage(attacker.addr, 5))
		follower := startHintServer(t, attacker.addr, leaderconn.TermKey, "5", leaderconn.SigKey, b64(sig))
		statusVia(t, jobCA, follower.addr, real.Addr().String())
		if attacker.calls.Load() == before {
			t.Error("a hint signed by the job CA was not followed")
		}
	})
}

// statusVia asks for the job's status as an agent whose job CA is jobCA
// would, through its connection over the replicas at addrs.
func statusVia(t *testing.T, jobCA *x509.Certificate, addrs ...string) *gotrainv1.JobStatus {
	t.Helper()
	a := &agent{log: slog.New(slog.DiscardHandler), cfg: Config{JobSettings: host.JobSettings{JobToken: keysToken}, Stderr: io.Discard}}
	a.jobCA = jobCA
	lc, err := a.dialCoordinator(addrs, jobtls.Trust{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer lc.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	st, err := gotrainv1.NewCoordinatorClient(lc).GetJobStatus(ctx, &gotrainv1.GetJobStatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	return st
}
