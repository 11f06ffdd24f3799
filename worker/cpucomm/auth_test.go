package cpucomm

import (
	"context"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/gotrain/gotrain/worker/comm/commtest"
)

// startRank0 starts rank 0 of a 2-rank communicator "a" generation 4 with
// token tok and returns its address and a channel of its New's result.
func startRank0(t *testing.T, store *commtest.MemStore, tok string) (string, <-chan error, func() *Comm) {
	t.Helper()
	type result struct {
		c   *Comm
		err error
	}
	ch := make(chan result, 1)
	go func() {
		c, err := New(t.Context(), Config{Name: "a", Generation: 4, Rank: 0, Size: 2, Host: "127.0.0.1", Store: store, Token: tok})
		ch <- result{c, err}
	}()
	addr, err := store.Get(t.Context(), AddrKey("a", 4, 0))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	var c0 *Comm
	go func() { r := <-ch; c0 = r.c; done <- r.err }()
	return string(addr), done, func() *Comm { return c0 }
}

// A connection without the job token took rank 1's place
// (and could inject values). It is refused, and the real rank 1 gets in.
func TestStrangerWithoutTokenIsRefused(t *testing.T) {
	store := commtest.NewMemStore()
	addr, done0, comm0 := startRank0(t, store, "job-secret")
	for _, tok := range []string{"", "wrong-secret", "job-secre"} {
		stranger := &Comm{name: "a", generation: 4, rank: 1, size: 2, token: []byte(tok)}
		s := commtest.NewMemStore()
		s.Put(t.Context(), AddrKey("a", 4, 0), []byte(addr))
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		p, err := stranger.dial(ctx, s, "127.0.0.1:1", 0)
		cancel()
		if err == nil {
			p.conn.Close()
			t.Fatalf("a dialer with token %q was accepted as rank 1", tok)
		}
	}
	c1, err := New(t.Context(), Config{Name: "a", Generation: 4, Rank: 1, Size: 2, Host: "127.0.0.1", Store: store, Token: "job-secret"})
	if err != nil {
		t.Fatalf("the real rank 1: %v", err)
	}
	defer c1.Close()
	if err := <-done0; err != nil {
		t.Fatal(err)
	}
	c0 := comm0()
	defer c0.Close()
	mustAll(t, onAll([]*Comm{c0, c1}, func(_ int, c *Comm) error { return c.Barrier(t.Context()) }))
}

// A listener without the token (a stranger at a rank's published address)
// does not get a rank's connection either: the dialer checks the acceptor.
func TestDialerRefusesAcceptorWithoutToken(t *testing.T) {
	store := commtest.NewMemStore()
	addr, done0, _ := startRank0(t, store, "other-secret")
	s := commtest.NewMemStore()
	s.Put(t.Context(), AddrKey("a", 4, 0), []byte(addr))
	c := &Comm{name: "a", generation: 4, rank: 1, size: 2, token: []byte("job-secret")}
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	if p, err := c.dial(ctx, s, "127.0.0.1:1", 0); err == nil {
		p.conn.Close()
		t.Fatal("a rank connected to a listener that does not hold its token")
	} else if !strings.Contains(err.Error(), "token") {
		t.Errorf("the error does not name the token: %v", err)
	}
	_ = done0
}

// Two idle connections to a rank's port delayed New by
// 20 s (each held the accept loop for the 10 s handshake timeout). They no
// longer delay it, and each is closed within the handshake deadline.
func TestIdleConnectionsDoNotDelayNew(t *testing.T) {
	store := commtest.NewMemStore()
	addr, done0, comm0 := startRank0(t, store, "job-secret")
	var idle []net.Conn
	for range 2 {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		idle = append(idle, c)
	}
	time.Sleep(50 * time.Millisecond) // let rank 0 accept them first
	start := time.Now()
	c1, err := New(t.Context(), Config{Name: "a", Generation: 4, Rank: 1, Size: 2, Host: "127.0.0.1", Store: store, Token: "job-secret"})
	if err != nil {
		t.Fatal(err)
	}
	defer c1.Close()
	if err := <-done0; err != nil {
		t.Fatal(err)
	}
	defer comm0().Close()
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("New took %v with two idle connections open, want well under 2 s", d)
	}
	for _, c := range idle {
		_ = c.SetReadDeadline(time.Now().Add(acceptHandshakeTimeout + 3*time.Second))
		start := time.Now()
		_, err := io.Copy(io.Discard, c)
		if err != nil {
			t.Errorf("an idle connection was not closed within %v: %v", time.Since(start), err)
		}
	}
}

// 64 silent connections to a rank's port (the bound on
// handshakes in progress) made it close every rank's connection until they
// timed out, so New failed. Now strangers flooding from another address
// evict their own connections: at most acceptLimits' bound of theirs stay
// open, and the rank's own connection is taken.
func TestFloodDoesNotKeepRanksOut(t *testing.T) {
	store := commtest.NewMemStore()
	addr, done0, comm0 := startRank0(t, store, "job-secret")
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.2")}}
	var flood []net.Conn
	defer func() {
		for _, c := range flood {
			c.Close()
		}
	}()
	for range 300 {
		c, err := d.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		flood = append(flood, c)
	}
	ctx, cancel := context.WithTimeout(t.Context(), acceptHandshakeTimeout/2)
	defer cancel()
	c1, err := New(ctx, Config{Name: "a", Generation: 4, Rank: 1, Size: 2, Host: "127.0.0.1", Store: store, Token: "job-secret"})
	if err != nil {
		t.Fatalf("rank 1 during the flood: %v", err)
	}
	defer c1.Close()
	if err := <-done0; err != nil {
		t.Fatal(err)
	}
	defer comm0().Close()
	max := acceptLimits(2).Unauthenticated
	open := 0
	for _, c := range flood {
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Millisecond))
		if _, err := io.Copy(io.Discard, c); err != nil {
			open++
		}
	}
	if open > max {
		t.Errorf("%d of %d strangers' connections open, want at most %d", open, len(flood), max)
	}
}
