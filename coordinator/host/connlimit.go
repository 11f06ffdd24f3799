package host

import (
	"log/slog"
	"net"
	"sync"
	"time"
)

// Connection bounds of a coordinator's listener (issue 16, item 1): idle
// connections to the coordinator's port used up the hosting agent's file
// descriptors. A connection over a bound is closed as soon as it is
// accepted; one that stays silent is closed by the gRPC server's handshake
// deadline (coordinator/limits.go), so each costs a descriptor for seconds
// at most.
const (
	// MaxConns bounds the connections the coordinator holds open: two per
	// node at most (the Join connection, then the node's own) for 4096
	// nodes (the scale benchmark found 1024 refusing every larger job).
	MaxConns = 8192
	// MaxConnsPerIP bounds those from one remote address (an agent holds
	// one or two; gotrain top and diagnose one each): enough for 128 agents
	// on one machine, or behind one NAT address, which 64 refused.
	MaxConnsPerIP = 512
)

// limitListener accepts at most total connections at once, and at most
// perIP from one remote IP; it closes the others at once.
type limitListener struct {
	net.Listener
	total, perIP int
	log          *slog.Logger
	now          func() time.Time

	mu       sync.Mutex
	open     int
	byIP     map[string]int
	refused  int       // since the last warning
	warnedAt time.Time // the last warning about refused connections
}

var _ net.Listener = (*limitListener)(nil)

// newLimitListener bounds lis's connections (total, perIP; log is warned,
// at most every 10 s, of those it refused).
func newLimitListener(lis net.Listener, total, perIP int, log *slog.Logger) *limitListener {
	return &limitListener{Listener: lis, total: total, perIP: perIP, log: log, now: time.Now, byIP: map[string]int{}}
}

// Accept returns the next connection within the bounds; the others are
// closed without a byte read.
func (l *limitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		ip := remoteIP(c)
		if l.admit(ip) {
			return &limitConn{Conn: c, release: func() { l.release(ip) }}, nil
		}
		_ = c.Close()
	}
}

func (l *limitListener) admit(ip string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.open < l.total && l.byIP[ip] < l.perIP {
		l.open++
		l.byIP[ip]++
		return true
	}
	l.refused++
	if now := l.now(); now.Sub(l.warnedAt) >= 10*time.Second {
		l.log.Warn("connections refused: over the coordinator's connection limit", "remote_ip", ip,
			"refused", l.refused, "open", l.open, "open_from_ip", l.byIP[ip], "max", l.total, "max_per_ip", l.perIP)
		l.refused, l.warnedAt = 0, now
	}
	return false
}

func (l *limitListener) release(ip string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.open--
	if l.byIP[ip]--; l.byIP[ip] <= 0 {
		delete(l.byIP, ip)
	}
}

func remoteIP(c net.Conn) string {
	if a, ok := c.RemoteAddr().(*net.TCPAddr); ok {
		return a.IP.String()
	}
	host, _, err := net.SplitHostPort(c.RemoteAddr().String())
	if err != nil {
		return c.RemoteAddr().String()
	}
	return host
}

// limitConn gives its slot back once, when closed.
type limitConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *limitConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}
