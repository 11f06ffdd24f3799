package connguard

import (
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// server is a guarded listener on 127.0.0.1 whose accepted connections are
// kept by their client's address, so that a test can mark them.
type server struct {
	*Listener
	mu    sync.Mutex
	conns map[string]*Conn // client's local address -> the server's Conn
	done  chan struct{}
}

func serve(t *testing.T, lim Limits) *server {
	t.Helper()
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &server{Listener: Listen(inner, "the test port", lim, nil), conns: map[string]*Conn{}, done: make(chan struct{})}
	go func() {
		defer close(s.done)
		for {
			c, err := s.Accept()
			if err != nil {
				return
			}
			s.mu.Lock()
			s.conns[c.RemoteAddr().String()] = c.(*Conn)
			s.mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		_ = s.Close()
		<-s.done
		s.mu.Lock()
		defer s.mu.Unlock()
		for _, c := range s.conns {
			_ = c.Close()
		}
	})
	return s
}

// dial connects from src and returns the client's end.
func (s *server) dial(t *testing.T, src string) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}
	c, err := d.Dial("tcp", s.Addr().String())
	if err != nil {
		t.Fatalf("dial from %s: %v", src, err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// accepted waits for the server's end of client c.
func (s *server) accepted(t *testing.T, c net.Conn) *Conn {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		s.mu.Lock()
		sc := s.conns[c.LocalAddr().String()]
		s.mu.Unlock()
		if sc != nil {
			return sc
		}
	}
	t.Fatalf("the server never accepted %s", c.LocalAddr())
	return nil
}

// closed says whether the server closed c within d (c reads EOF).
func closed(c net.Conn, d time.Duration) bool {
	_ = c.SetReadDeadline(time.Now().Add(d))
	_, err := io.Copy(io.Discard, c)
	return err == nil
}

// open says whether c is still open: the server has not closed it.
func open(c net.Conn) bool { return !closed(c, 50*time.Millisecond) }

// A source at its bound of unauthenticated connections evicts its own
// oldest; a full pool evicts from the source holding the most; marked
// connections are never evicted.
func TestEviction(t *testing.T) {
	s := serve(t, Limits{Unauthenticated: 4, UnauthenticatedPerSource: 3, Authenticated: 4})
	a1, a2, a3 := s.dial(t, "127.0.0.1"), s.dial(t, "127.0.0.1"), s.dial(t, "127.0.0.1")
	s.accepted(t, a3)
	a4 := s.dial(t, "127.0.0.1")
	if !closed(a1, 10*time.Second) {
		t.Fatal("a fourth connection from a source at its bound of 3 did not evict its first")
	}
	b1 := s.dial(t, "127.0.0.2")
	s.accepted(t, b1)
	// The pool (4) is full: 127.0.0.1 holds 3, 127.0.0.2 one. A new source
	// evicts from the one holding the most, its oldest (a2).
	c1 := s.dial(t, "127.0.0.3")
	if !closed(a2, 10*time.Second) {
		t.Fatal("a new source did not evict the oldest connection of the source holding the most")
	}
	for _, c := range []net.Conn{a3, a4, b1} {
		if !open(c) {
			t.Errorf("%s was closed, want open", c.LocalAddr())
		}
	}
	if err := s.accepted(t, c1).MarkAuthenticated(); err != nil {
		t.Fatal(err)
	}
	for i := range 8 {
		s.accepted(t, s.dial(t, fmt.Sprintf("127.0.0.%d", 10+i)))
	}
	if !open(c1) {
		t.Error("an authenticated connection was evicted by new unauthenticated ones")
	}
}

// The key property: 16 flooding sources that keep the unauthenticated
// budget full (reconnecting as soon as they are evicted) never evict the
// single connection of another source, which then authenticates.
func TestFloodDoesNotStarveASingleConnection(t *testing.T) {
	s := serve(t, Limits{Unauthenticated: 32, UnauthenticatedPerSource: 8, Authenticated: 8})
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var floods sync.Map
	for i := range 16 {
		wg.Go(func() {
			d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(fmt.Sprintf("127.0.1.%d", i+1))}}
			var held []net.Conn
			defer func() {
				for _, c := range held {
					_ = c.Close()
				}
			}()
			for n := 0; ; n++ {
				select {
				case <-stop:
					floods.Store(i, n)
					return
				default:
				}
				c, err := d.Dial("tcp", s.Addr().String())
				if err != nil {
					continue
				}
				held = append(held, c)
				if len(held) > 16 {
					_ = held[0].Close()
					held = held[1:]
				}
			}
		})
	}
	defer func() { close(stop); wg.Wait() }()
	time.Sleep(200 * time.Millisecond) // the flood fills the budget
	peer := s.dial(t, "127.0.0.77")
	sc := s.accepted(t, peer)
	time.Sleep(200 * time.Millisecond) // more flood: evictions
	if !open(peer) {
		t.Fatal("the flood evicted the single connection of another source")
	}
	if err := sc.MarkAuthenticated(); err != nil {
		t.Fatalf("mark the peer's connection: %v", err)
	}
	if !open(peer) {
		t.Fatal("an authenticated connection was closed during the flood")
	}
	s.mu.Lock()
	n := len(s.conns)
	s.mu.Unlock()
	t.Logf("the flood made %d connections; the pool holds %d unauthenticated at most", n, 32)
}

// A connection not authenticated within the handshake deadline is closed;
// one authenticated is not, and one idle for the idle deadline is.
func TestDeadlines(t *testing.T) {
	s := serve(t, Limits{Unauthenticated: 8, HandshakeTimeout: 300 * time.Millisecond, Authenticated: 8, IdleTimeout: 2 * time.Second})
	silent := s.dial(t, "127.0.0.1")
	marked := s.dial(t, "127.0.0.1")
	sc := s.accepted(t, marked)
	if err := sc.MarkAuthenticated(); err != nil {
		t.Fatal(err)
	}
	read := make(chan struct{})
	go func() { defer close(read); _, _ = io.Copy(io.Discard, sc) }() // the server reads what it is sent
	defer func() { <-read }()
	if !closed(silent, 20*time.Second) {
		t.Fatal("a silent connection outlived the handshake deadline")
	}
	// marked keeps talking for longer than the idle deadline: it stays.
	for range 6 {
		if _, err := marked.Write([]byte("x")); err != nil {
			t.Fatal(err)
		}
		time.Sleep(500 * time.Millisecond)
	}
	if !open(marked) {
		t.Fatal("an authenticated connection that kept sending was closed")
	}
	if !closed(marked, 30*time.Second) {
		t.Fatal("an idle connection outlived the idle deadline")
	}
}

// Marking over the authenticated bound (in all or per source) closes the
// connection with ErrFull; a place freed is taken again.
func TestAuthenticatedBound(t *testing.T) {
	s := serve(t, Limits{Unauthenticated: 8, Authenticated: 3, AuthenticatedPerSource: 2})
	var marked []net.Conn
	for _, src := range []string{"127.0.0.1", "127.0.0.1"} {
		c := s.dial(t, src)
		if err := s.accepted(t, c).MarkAuthenticated(); err != nil {
			t.Fatal(err)
		}
		marked = append(marked, c)
	}
	third := s.dial(t, "127.0.0.1")
	if err := s.accepted(t, third).MarkAuthenticated(); !errors.Is(err, ErrFull) {
		t.Fatalf("a third from one source (bound 2): %v, want ErrFull", err)
	}
	if !closed(third, 10*time.Second) {
		t.Fatal("the connection refused a place stayed open")
	}
	other := s.dial(t, "127.0.0.2")
	if err := s.accepted(t, other).MarkAuthenticated(); err != nil {
		t.Fatal(err)
	}
	fourth := s.dial(t, "127.0.0.3")
	if err := s.accepted(t, fourth).MarkAuthenticated(); !errors.Is(err, ErrFull) {
		t.Fatalf("a fourth (bound 3): %v, want ErrFull", err)
	}
	_ = s.accepted(t, marked[0]).Close()
	again := s.dial(t, "127.0.0.3")
	if err := s.MarkAuthenticated(s.accepted(t, again).LocalAddr(), again.LocalAddr()); err != nil {
		t.Fatalf("after one closed, by address: %v", err)
	}
	if !s.accepted(t, again).Authenticated() {
		t.Error("MarkAuthenticated by address did not mark the connection")
	}
}

// Without an unauthenticated budget every connection counts as
// authenticated: one over the bound is closed, none evicted.
func TestAuthenticatedOnly(t *testing.T) {
	s := serve(t, Limits{Authenticated: 2})
	a, b := s.dial(t, "127.0.0.1"), s.dial(t, "127.0.0.1")
	s.accepted(t, b)
	c := s.dial(t, "127.0.0.1")
	if !closed(c, 10*time.Second) {
		t.Fatal("a third connection (bound 2) stayed open")
	}
	if !open(a) || !open(b) {
		t.Fatal("a connection within the bound was closed")
	}
	_ = s.accepted(t, a).Close()
	if d := s.dial(t, "127.0.0.1"); !s.accepted(t, d).Authenticated() || !open(d) {
		t.Fatal("a connection after one closed was refused")
	}
}

func TestSource(t *testing.T) {
	for addr, want := range map[net.Addr]string{
		&net.TCPAddr{IP: net.ParseIP("10.0.0.1"), Port: 5}:             "10.0.0.1",
		&net.TCPAddr{IP: net.ParseIP("::ffff:10.0.0.1"), Port: 5}:      "10.0.0.1",
		&net.TCPAddr{IP: net.ParseIP("2001:db8:1:2:3:4:5:6"), Port: 5}: "2001:db8:1:2::/64",
		&net.UnixAddr{Name: "@", Net: "unix"}:                          "@",
	} {
		if got := source(addr); got != want {
			t.Errorf("source(%v) = %q, want %q", addr, got, want)
		}
	}
}
