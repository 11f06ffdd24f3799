package gossip

import (
	"io"
	"net"
	"strconv"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// Issue 24, item 4: the gossip port had no connection bound: silent TCP
// connections took 20 000 descriptors in seconds. Now a source keeps at
// most MaxStreamsPerSource of them, and a member joins through the port
// during the flood (its push/pull comes from another source).
func TestGossipFloodIsBounded(t *testing.T) {
	defer goleak.VerifyNone(t)
	a, err := Start(Options{Name: "coordinator", BindAddr: "127.0.0.1", Token: "tok"})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Shutdown()
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(int(a.LocalNode().Port)))
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.2")}}
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			_ = c.Close()
		}
	}()
	for range MaxStreamsPerSource + 200 {
		c, err := d.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
	}
	open := conns
	for deadline := time.Now().Add(StreamTimeout / 2); len(open) > MaxStreamsPerSource && time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		var left []net.Conn
		for _, c := range open {
			_ = c.SetReadDeadline(time.Now().Add(time.Millisecond))
			if _, err := io.Copy(io.Discard, c); err != nil { // a timeout: still open
				left = append(left, c)
			}
		}
		open = left
	}
	if len(open) > MaxStreamsPerSource {
		t.Errorf("%d of %d silent connections to the gossip port are open, want at most %d", len(open), len(conns), MaxStreamsPerSource)
	}
	b, err := Start(Options{Name: "node-1", BindAddr: "127.0.0.1", Token: "tok"})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Shutdown()
	if _, err := b.Join([]string{addr}); err != nil {
		t.Fatalf("join during the flood: %v", err)
	}
	for deadline := time.Now().Add(30 * time.Second); a.NumMembers() != 2 || b.NumMembers() != 2; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("members %d and %d, want 2 each", a.NumMembers(), b.NumMembers())
		}
	}
}
