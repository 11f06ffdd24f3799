package host

import (
	"context"
	"io"
	"log/slog"
	"net"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"

	"github.com/gotrain/gotrain/internal/jobtls"
	"github.com/gotrain/gotrain/internal/token"
	gotrainv1 "github.com/gotrain/gotrain/proto/gotrain/v1"
)

// closedSoon says whether the server closes c within d (reads EOF).
func closedSoon(c net.Conn, d time.Duration) bool {
	_ = c.SetReadDeadline(time.Now().Add(d))
	_, err := io.Copy(io.Discard, c)
	return err == nil // EOF: closed by the server; a timeout: still open
}

func dialFrom(t *testing.T, src, addr string) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Skipf("dial from %s: %v", src, err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// The listener holds at most perIP connections from one address and total
// in all; it closes the others at once and frees a slot when a connection
// closes.
func TestLimitListener(t *testing.T) {
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	lis := newLimitListener(inner, 3, 2, slog.New(slog.DiscardHandler))
	defer lis.Close()
	accepted := make(chan net.Conn, 16)
	go func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				close(accepted)
				return
			}
			accepted <- c
		}
	}()
	addr := inner.Addr().String()
	a1, a2 := dialFrom(t, "127.0.0.1", addr), dialFrom(t, "127.0.0.1", addr)
	a3 := dialFrom(t, "127.0.0.1", addr)
	if !closedSoon(a3, 2*time.Second) {
		t.Error("a third connection from one address stayed open (per-IP limit 2)")
	}
	b1 := dialFrom(t, "127.0.0.2", addr)
	b2 := dialFrom(t, "127.0.0.2", addr)
	if !closedSoon(b2, 2*time.Second) {
		t.Error("a fourth connection stayed open (total limit 3)")
	}
	for _, c := range []net.Conn{a1, a2, b1} {
		if closedSoon(c, 100*time.Millisecond) {
			t.Errorf("a connection within the limits from %s was closed", c.LocalAddr())
		}
	}
	(<-accepted).Close() // the server closes one: its slot is free again
	if c := dialFrom(t, "127.0.0.3", addr); closedSoon(c, 200*time.Millisecond) {
		t.Error("a connection after one closed was refused")
	}
}

// Issue 16, item 1: idle TCP connections to the coordinator's port used up
// the agent's file descriptors. Connections past MaxConnsPerIP from one
// address are closed at once, every silent one within the handshake
// deadline, and a real client from another address is served throughout.
func TestIdleConnectionFloodIsBounded(t *testing.T) {
	defer goleak.VerifyNone(t)
	c, err := Start(t.Context(), testConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Stop()
	addr := c.Addr().String()
	const extra = 20
	var conns []net.Conn
	for range MaxConnsPerIP + extra {
		conns = append(conns, dialFrom(t, "127.0.0.1", addr))
	}
	refused := 0
	for _, conn := range conns {
		if closedSoon(conn, 20*time.Millisecond) {
			refused++
		}
	}
	if refused < extra {
		t.Errorf("%d of %d idle connections from one address were closed at once, want at least %d (limit %d)",
			refused, len(conns), extra, MaxConnsPerIP)
	}
	coord, closeConn := clientFrom(t, "127.0.0.2", addr)
	defer closeConn()
	ctx, cancel := context.WithTimeout(t.Context(), rpcTimeout)
	defer cancel()
	if _, err := coord.GetJobStatus(ctx, &gotrainv1.GetJobStatusRequest{}); err != nil {
		t.Errorf("a client from another address during the flood: %v", err)
	}
	start := time.Now()
	for _, conn := range conns {
		if !closedSoon(conn, 10*time.Second-time.Since(start)) {
			t.Fatalf("a silent connection was still open after %v", time.Since(start))
		}
	}
	t.Logf("every silent connection closed within %v", time.Since(start))
}

// clientFrom is client with connections from the local address src.
func clientFrom(t *testing.T, src, addr string) (gotrainv1.CoordinatorClient, func()) {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}
	creds, err := jobtls.Trust{SkipCheck: true}.Credentials(testToken, nil)
	if err != nil {
		t.Fatal(err)
	}
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds), token.DialOption(testToken),
		grpc.WithContextDialer(func(ctx context.Context, a string) (net.Conn, error) { return d.DialContext(ctx, "tcp", a) }))
	if err != nil {
		t.Fatal(err)
	}
	return gotrainv1.NewCoordinatorClient(cc), func() { _ = cc.Close() }
}
