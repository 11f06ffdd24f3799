package gossip

import (
	"net"
	"strconv"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/gotrain/gotrain/internal/connguard/connguardtest"
)

// The gossip port had no connection bound: silent TCP
// connections took 20 000 descriptors in seconds. Now a source keeps at
// most MaxStreamsPerSource of them, and a member joins through the port
// during the flood (its push/pull comes from another source).
func TestGossipFloodIsBounded(t *testing.T) {
	defer verifyNoGoroutineLeft(t)
	a, err := Start(Options{Name: "coordinator", BindAddr: "127.0.0.1", Token: "tok"})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Shutdown()
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(int(a.LocalNode().Port)))
	conns := connguardtest.Flood(t, "127.0.0.2", addr, MaxStreamsPerSource+200)
	defer func() { // before goleak: memberlist's readers end with their connections
		for _, c := range conns {
			_ = c.Close()
		}
	}()
	if open := connguardtest.StillOpen(conns, MaxStreamsPerSource, StreamTimeout/2); open > MaxStreamsPerSource {
		t.Errorf("%d of %d silent connections to the gossip port are open, want at most %d", open, len(conns), MaxStreamsPerSource)
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

// verifyNoGoroutineLeft fails t when goroutines other than the test's own
// are still running 10 s after the members shut down. memberlist's Shutdown
// does not wait for a probe already in flight: it ends on its own within
// ProbeInterval (plus the TCP fallback's deadline), longer than goleak's own
// patience (~0.4 s), and longer still on a loaded machine.
func verifyNoGoroutineLeft(t *testing.T) {
	t.Helper()
	var err error
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if err = goleak.Find(); err == nil {
			return
		}
	}
	t.Error(err)
}
