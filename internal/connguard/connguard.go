// Package connguard bounds the connections a listening port holds, so that
// neither a flood of connections nor a few held open for good can exhaust a
// process's file descriptors or keep the job's own peers out.
//
// A connection is accepted as unauthenticated. Unauthenticated connections
// have a budget of their own (in all and per source) and a handshake
// deadline: one that has not authenticated within it is closed. When that
// budget is full, a new connection evicts the oldest unauthenticated one
// of the source holding the most (of its own source when that source is at
// its bound): an outsider filling the budget from many addresses evicts
// only its own connections, never a peer's single one, which authenticates
// within milliseconds. The caller marks a connection authenticated once it
// proved who it is (a gRPC call whose credentials were found valid, a
// completed mutual TLS handshake); it then moves to the authenticated
// budget, bounded separately, and is never evicted. A listener whose peers
// are authenticated by other means (a unix socket in a private directory)
// sets only the authenticated bounds: every connection counts there at
// once, and one over the bound is closed. Either kind is closed when it
// sent nothing for the idle deadline.
//
// A source is an IPv4 address, or an IPv6 /64 (one host's usual share).
//
// golang.org/x/net/netutil.LimitListener only counts: it blocks Accept
// when full (the next connection, a peer's too, waits behind the flood),
// has no notion of source, deadline or authentication, and hides the
// connection it wraps (SO_PEERCRED needs it); so this package is written
// here.
package connguard

import (
	"container/list"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Limits bound one port's connections. A zero bound is none allowed,
// except the per-source ones: zero there is the whole pool's bound.
type Limits struct {
	// Unauthenticated and UnauthenticatedPerSource bound the connections
	// not yet authenticated; 0 Unauthenticated: every connection counts as
	// authenticated when accepted.
	Unauthenticated, UnauthenticatedPerSource int
	// HandshakeTimeout closes a connection not authenticated within it;
	// 0: never.
	HandshakeTimeout time.Duration
	// Authenticated and AuthenticatedPerSource bound the authenticated.
	Authenticated, AuthenticatedPerSource int
	// IdleTimeout closes a connection that sent nothing for it; 0: never.
	IdleTimeout time.Duration
}

// Max is the most connections the limits let a port hold at once.
func (l Limits) Max() int { return l.Unauthenticated + l.Authenticated }

func (l Limits) withDefaults() Limits {
	if l.UnauthenticatedPerSource <= 0 || l.UnauthenticatedPerSource > l.Unauthenticated {
		l.UnauthenticatedPerSource = l.Unauthenticated
	}
	if l.AuthenticatedPerSource <= 0 || l.AuthenticatedPerSource > l.Authenticated {
		l.AuthenticatedPerSource = l.Authenticated
	}
	return l
}

// ErrFull: the authenticated bound is full; the connection was closed.
var ErrFull = errors.New("connguard: the port holds its maximum of authenticated connections")

// Guard keeps one port's connections within its Limits.
type Guard struct {
	name string // the port, in warnings: "the coordinator's gRPC port"
	lim  Limits
	log  *slog.Logger
	base time.Time // of Conn.lastRead

	mu       sync.Mutex
	seq      uint64
	pending  map[string]*list.List // source -> its unauthenticated *Conn, oldest first
	nPending int
	authed   map[string]int // source -> its authenticated connections
	nAuthed  int
	byAddr   map[string]*Conn // addrKey -> an unauthenticated connection (MarkAuthenticated)
	dropped  map[string]int   // why -> connections closed since the last warning
	warnedAt time.Time
}

// New returns a guard for the port name (named in its warnings, at most one
// every 10 s, to log).
func New(name string, lim Limits, log *slog.Logger) *Guard {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Guard{name: name, lim: lim.withDefaults(), log: log, base: time.Now(),
		pending: map[string]*list.List{}, authed: map[string]int{}, byAddr: map[string]*Conn{}, dropped: map[string]int{}}
}

// Counts are the connections the guard holds now, unauthenticated and
// authenticated.
func (g *Guard) Counts() (unauthenticated, authenticated int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.nPending, g.nAuthed
}

// Limits are the guard's bounds, defaults filled in.
func (g *Guard) Limits() Limits { return g.lim }

// Conn states, guarded by Guard.mu.
const (
	statePending = iota
	stateAuthed
	stateClosed
)

// Conn is a connection within a guard's bounds. Close gives its place back.
type Conn struct {
	net.Conn
	g    *Guard
	src  string
	key  string
	seq  uint64
	elem *list.Element // in g.pending[src] while pending

	state     int // guarded by g.mu
	handshake *time.Timer
	idle      *time.Timer
	lastRead  atomic.Int64 // nanoseconds since g.base
	closeOnce sync.Once
}

// Admit brings c, just accepted, within the bounds: it returns c's Conn,
// or closes c and returns nil when there is no room for it.
func (g *Guard) Admit(c net.Conn) *Conn {
	gc := &Conn{Conn: c, g: g, src: source(c.RemoteAddr())}
	// The timers exist before gc is shared; their functions take g.mu.
	if g.lim.Unauthenticated > 0 && g.lim.HandshakeTimeout > 0 {
		gc.handshake = time.AfterFunc(g.lim.HandshakeTimeout, gc.handshakeOver)
	}
	if g.lim.IdleTimeout > 0 {
		gc.lastRead.Store(int64(time.Since(g.base)))
		gc.idle = time.AfterFunc(g.lim.IdleTimeout, gc.checkIdle)
	}
	var victim *Conn
	g.mu.Lock()
	g.seq++
	gc.seq = g.seq
	if g.lim.Unauthenticated == 0 {
		if g.nAuthed >= g.lim.Authenticated || g.authed[gc.src] >= g.lim.AuthenticatedPerSource {
			g.dropLocked("over the bound", gc.src)
			gc.state = stateClosed
			g.mu.Unlock()
			gc.closeNow()
			return nil
		}
		gc.state = stateAuthed
		g.authed[gc.src]++
		g.nAuthed++
	} else {
		if victim = g.victimLocked(gc.src); victim != nil {
			g.removePendingLocked(victim)
			victim.state = stateClosed
			g.dropLocked("evicted", victim.src)
		}
		q := g.pending[gc.src]
		if q == nil {
			q = list.New()
			g.pending[gc.src] = q
		}
		gc.elem = q.PushBack(gc)
		g.nPending++
		if g.lim.Authenticated > 0 {
			gc.key = addrKey(c.LocalAddr(), c.RemoteAddr())
			g.byAddr[gc.key] = gc
		}
	}
	g.mu.Unlock()
	if victim != nil {
		victim.closeNow()
	}
	return gc
}

// victimLocked is the pending connection a new one from src evicts: the
// oldest of src when src is at its bound, else, when the pool is full, the
// oldest of the source holding the most (the oldest first among equals).
func (g *Guard) victimLocked(src string) *Conn {
	if q := g.pending[src]; q != nil && q.Len() >= g.lim.UnauthenticatedPerSource {
		return q.Front().Value.(*Conn)
	}
	if g.nPending < g.lim.Unauthenticated {
		return nil
	}
	var most *Conn
	n := 0
	for _, q := range g.pending {
		oldest := q.Front().Value.(*Conn)
		if q.Len() > n || (q.Len() == n && oldest.seq < most.seq) {
			most, n = oldest, q.Len()
		}
	}
	return most
}

func (g *Guard) removePendingLocked(c *Conn) {
	q := g.pending[c.src]
	q.Remove(c.elem)
	if q.Len() == 0 {
		delete(g.pending, c.src)
	}
	g.nPending--
	if c.key != "" && g.byAddr[c.key] == c {
		delete(g.byAddr, c.key)
	}
}

// dropLocked counts a connection closed for why and warns, at most every
// 10 s, of those closed since the last warning.
func (g *Guard) dropLocked(why, src string) {
	g.dropped[why]++
	now := time.Now()
	if now.Sub(g.warnedAt) < 10*time.Second {
		return
	}
	g.log.Warn("connections closed: over "+g.name+"'s connection bounds", "last_source", src, "closed", fmt.Sprint(g.dropped),
		"unauthenticated", g.nPending, "authenticated", g.nAuthed, "max_unauthenticated", g.lim.Unauthenticated,
		"max_unauthenticated_per_source", g.lim.UnauthenticatedPerSource, "max_authenticated", g.lim.Authenticated,
		"max_authenticated_per_source", g.lim.AuthenticatedPerSource)
	clear(g.dropped)
	g.warnedAt = now
}

// MarkAuthenticated moves the connection from remote to local (a gRPC
// call's peer) to the authenticated budget; see Conn.MarkAuthenticated.
// A connection the guard does not hold unauthenticated (already marked,
// closed, or not its own) is left alone: nil.
func (g *Guard) MarkAuthenticated(local, remote net.Addr) error {
	if local == nil || remote == nil {
		return nil
	}
	g.mu.Lock()
	c := g.byAddr[addrKey(local, remote)]
	g.mu.Unlock()
	if c == nil {
		return nil
	}
	return c.MarkAuthenticated()
}

// MarkAuthenticated moves c to the authenticated budget: no handshake
// deadline, never evicted. When that budget (in all or of c's source) is
// full, c is closed and the error is ErrFull.
func (c *Conn) MarkAuthenticated() error {
	g := c.g
	g.mu.Lock()
	switch c.state {
	case stateAuthed:
		g.mu.Unlock()
		return nil
	case stateClosed:
		g.mu.Unlock()
		return net.ErrClosed
	}
	if g.nAuthed >= g.lim.Authenticated || g.authed[c.src] >= g.lim.AuthenticatedPerSource {
		g.removePendingLocked(c)
		c.state = stateClosed
		g.dropLocked("authenticated over the bound", c.src)
		g.mu.Unlock()
		c.closeNow()
		return ErrFull
	}
	g.removePendingLocked(c)
	c.state = stateAuthed
	g.authed[c.src]++
	g.nAuthed++
	g.mu.Unlock()
	if c.handshake != nil {
		c.handshake.Stop()
	}
	return nil
}

// Authenticated says whether c was marked authenticated (or counts as it).
func (c *Conn) Authenticated() bool {
	c.g.mu.Lock()
	defer c.g.mu.Unlock()
	return c.state == stateAuthed
}

// NetConn is the connection c wraps (as tls.Conn's NetConn).
func (c *Conn) NetConn() net.Conn { return c.Conn }

func (c *Conn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if n > 0 && c.idle != nil {
		c.lastRead.Store(int64(time.Since(c.g.base)))
	}
	return n, err
}

// Close closes the connection and gives its place back.
func (c *Conn) Close() error {
	err := c.Conn.Close()
	c.release()
	return err
}

// closeNow closes a connection whose place the guard already took back.
func (c *Conn) closeNow() {
	_ = c.Conn.Close()
	c.release()
}

func (c *Conn) release() {
	c.closeOnce.Do(func() {
		if c.handshake != nil {
			c.handshake.Stop()
		}
		if c.idle != nil {
			c.idle.Stop()
		}
		g := c.g
		g.mu.Lock()
		defer g.mu.Unlock()
		switch c.state {
		case statePending:
			g.removePendingLocked(c)
		case stateAuthed:
			if g.authed[c.src]--; g.authed[c.src] <= 0 {
				delete(g.authed, c.src)
			}
			g.nAuthed--
		}
		c.state = stateClosed
	})
}

// handshakeOver closes c when it is still not authenticated.
func (c *Conn) handshakeOver() {
	g := c.g
	g.mu.Lock()
	if c.state != statePending {
		g.mu.Unlock()
		return
	}
	g.removePendingLocked(c)
	c.state = stateClosed
	g.dropLocked("not authenticated in time", c.src)
	g.mu.Unlock()
	c.closeNow()
}

// checkIdle closes c when it sent nothing for the idle deadline, else
// looks again when it would have.
func (c *Conn) checkIdle() {
	idle := c.g.lim.IdleTimeout
	since := time.Since(c.g.base) - time.Duration(c.lastRead.Load())
	if since < idle {
		c.g.mu.Lock()
		closed := c.state == stateClosed
		c.g.mu.Unlock()
		if !closed {
			c.idle.Reset(idle - since)
		}
		return
	}
	c.g.mu.Lock()
	if c.state != stateClosed {
		c.g.dropLocked("idle", c.src)
	}
	c.g.mu.Unlock()
	_ = c.Close()
}

// Listener is a net.Listener whose connections a Guard bounds: Accept
// returns *Conn.
type Listener struct {
	net.Listener
	*Guard
}

// Listen bounds lis's connections by lim (name and log: New).
func Listen(lis net.Listener, name string, lim Limits, log *slog.Logger) *Listener {
	return &Listener{Listener: lis, Guard: New(name, lim, log)}
}

// Accept returns the next connection within the bounds; one without room
// is closed unread.
func (l *Listener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if gc := l.Admit(c); gc != nil {
			return gc, nil
		}
	}
}

// source is the part of a remote address the per-source bounds count: an
// IPv4 address, an IPv6 /64, or the whole address when not IP.
func source(a net.Addr) string {
	if a == nil {
		return ""
	}
	var ip net.IP
	if t, ok := a.(*net.TCPAddr); ok {
		ip = t.IP
	} else if host, _, err := net.SplitHostPort(a.String()); err == nil {
		ip = net.ParseIP(host)
	}
	if ip == nil {
		return a.String()
	}
	if v4 := ip.To4(); v4 != nil {
		return v4.String()
	}
	return ip.Mask(net.CIDRMask(64, 128)).String() + "/64"
}

func addrKey(local, remote net.Addr) string { return local.String() + " " + remote.String() }
