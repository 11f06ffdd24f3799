package host

import (
	"context"
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"go.uber.org/goleak"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc"

	"github.com/gotrain/gotrain/internal/connguard/connguardtest"
	"github.com/gotrain/gotrain/internal/jobtls"
	"github.com/gotrain/gotrain/internal/token"
	gotrainv1 "github.com/gotrain/gotrain/proto/gotrain/v1"
)

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

// Idle connections to the
// coordinator's port used up the agent's descriptors, and (once bounded)
// held the bound full. A source keeps at most MaxPendingConnsPerIP silent
// connections (a new one evicts its oldest); a client from another
// address, and one from the flood's own address, are served throughout;
// every silent connection is closed within the auth deadline.
func TestIdleConnectionFloodIsBounded(t *testing.T) {
	defer goleak.VerifyNone(t)
	c, err := Start(t.Context(), testConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Stop()
	addr := c.Addr().String()
	conns := connguardtest.Flood(t, "127.0.0.1", addr, MaxPendingConnsPerIP+200)
	if n := connguardtest.StillOpen(conns, MaxPendingConnsPerIP, 5*time.Second); n > MaxPendingConnsPerIP {
		t.Errorf("%d of %d silent connections from one address are open, want at most %d", n, len(conns), MaxPendingConnsPerIP)
	}
	for _, src := range []string{"127.0.0.2", "127.0.0.1"} {
		coord, closeConn := clientFrom(t, src, addr)
		ctx, cancel := context.WithTimeout(t.Context(), rpcTimeout)
		if _, err := coord.GetJobStatus(ctx, &gotrainv1.GetJobStatusRequest{}); err != nil {
			t.Errorf("a client from %s during the flood: %v", src, err)
		}
		cancel()
		closeConn()
	}
	start := time.Now()
	if n := connguardtest.StillOpen(conns, 0, AuthTimeout+20*time.Second); n > 0 {
		t.Fatalf("%d silent connections still open %v after the flood", n, time.Since(start))
	}
	t.Logf("every silent connection closed within %v", time.Since(start))
}

// A half-open HTTP/2 stream (TLS and HTTP/2 done, a
// call's headers sent without the token, its request never) held its
// connection for good. A connection that made no call with the job's
// credentials is closed within AuthTimeout; one that did is not.
func TestHalfOpenStreamWithoutTokenIsClosed(t *testing.T) {
	defer goleak.VerifyNone(t)
	c, err := Start(t.Context(), testConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Stop()
	raw := dialFrom(t, "127.0.0.3", c.Addr().String())
	tc := tls.Client(raw, &tls.Config{InsecureSkipVerify: true, NextProtos: []string{"h2"}}) // the test plays an outsider
	if err := tc.Handshake(); err != nil {
		t.Fatal(err)
	}
	fr := http2.NewFramer(tc, tc)
	if _, err := io.WriteString(tc, http2.ClientPreface); err != nil {
		t.Fatal(err)
	}
	if err := fr.WriteSettings(); err != nil {
		t.Fatal(err)
	}
	var hb []byte
	enc := hpack.NewEncoder(writerFunc(func(p []byte) (int, error) { hb = append(hb, p...); return len(p), nil }))
	for _, f := range [][2]string{{":method", "POST"}, {":scheme", "https"}, {":path", "/gotrain.v1.Coordinator/GetJobStatus"},
		{":authority", "coordinator"}, {"content-type", "application/grpc"}, {"te", "trailers"}} {
		_ = enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
	}
	if err := fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: hb, EndHeaders: true}); err != nil {
		t.Fatal(err)
	}
	// A real client from another address on the side: served, and its
	// connection outlives the deadline.
	coord, closeConn := clientFrom(t, "127.0.0.4", c.Addr().String())
	defer closeConn()
	if _, err := coord.GetJobStatus(t.Context(), &gotrainv1.GetJobStatusRequest{}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_ = tc.SetReadDeadline(time.Now().Add(AuthTimeout + 20*time.Second))
	for {
		if _, err := fr.ReadFrame(); err != nil {
			if ne, ok := err.(net.Error); ok && ne.Timeout() {
				t.Fatalf("the half-open stream's connection was still open %v later", time.Since(start))
			}
			break
		}
	}
	t.Logf("the half-open stream's connection was closed %v after its headers", time.Since(start).Round(time.Millisecond))
	ctx, cancel := context.WithTimeout(t.Context(), rpcTimeout)
	defer cancel()
	if _, err := coord.GetJobStatus(ctx, &gotrainv1.GetJobStatusRequest{}, grpc.WaitForReady(false)); err != nil {
		t.Errorf("the real client after the deadline: %v", err)
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

// /metrics had no connection bound. A source keeps at
// most MaxMetricsConnsPerIP connections; a scrape from another address is
// answered during the flood.
func TestMetricsFloodIsBounded(t *testing.T) {
	defer goleak.VerifyNone(t)
	cfg := testConfig()
	cfg.MetricsAddr = "127.0.0.1:0"
	c, err := Start(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Stop()
	conns := connguardtest.Flood(t, "127.0.0.1", c.MetricsAddr(), 300)
	if n := connguardtest.StillOpen(conns, MaxMetricsConnsPerIP, 5*time.Second); n > MaxMetricsConnsPerIP {
		t.Errorf("%d of %d silent /metrics connections from one address are open, want at most %d", n, len(conns), MaxMetricsConnsPerIP)
	}
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.5")}}
	hc := &http.Client{Transport: &http.Transport{DialContext: d.DialContext}, Timeout: rpcTimeout}
	defer hc.CloseIdleConnections()
	resp, err := hc.Get("http://" + c.MetricsAddr() + "/metrics")
	if err != nil {
		t.Fatalf("a scrape from another address during the flood: %v", err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("a scrape during the flood: %s", resp.Status)
	}
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
