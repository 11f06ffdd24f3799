package replica

import (
	"crypto/tls"
	"log/slog"
	"net"
	"time"

	"github.com/gotrain/gotrain/internal/connguard"
)

// Connection bounds of the Raft port (without them a
// flood of silent connections, each held by Raft's reader for good, took
// 20 000 descriptors in seconds). A connection counts as authenticated once
// its mutual TLS handshake verified a replica's certificate; until then it
// has RaftAuthTimeout, and a budget of its own where a flood evicts its
// own connections first. A replica holds a few connections to each other
// (Raft's pool of 3, its heartbeats and its pipeline): no idle deadline,
// pooled connections are idle by design.
const (
	MaxRaftPending          = 64
	MaxRaftPendingPerSource = 8
	RaftAuthTimeout         = 5 * time.Second
	MaxRaftConns            = 64
	MaxRaftConnsPerSource   = 16
)

// MaxSnapshotBytes bounds a snapshot a replica reads (one another replica
// sent): the FSM is handed no more (internal/coordinator/logentry checks its own
// bound again).
const MaxSnapshotBytes int64 = 2 << 30

// RaftLimits are the Raft port's bounds.
var RaftLimits = connguard.Limits{
	Unauthenticated: MaxRaftPending, UnauthenticatedPerSource: MaxRaftPendingPerSource, HandshakeTimeout: RaftAuthTimeout,
	Authenticated: MaxRaftConns, AuthenticatedPerSource: MaxRaftConnsPerSource,
}

// guardedListener wraps lis in the Raft port's bounds.
func guardedListener(lis net.Listener, log *slog.Logger) net.Listener {
	return connguard.Listen(lis, "the Raft port", RaftLimits, log)
}

// Accept returns the next connection within the bounds, with TLS when
// configured: a handshake that verifies the peer's certificate marks it
// authenticated. Without TLS (tests) every connection is.
func (s *tlsStream) Accept() (net.Conn, error) {
	c, err := s.Listener.Accept()
	if err != nil {
		return nil, err
	}
	gc, guarded := c.(*connguard.Conn)
	if s.server == nil {
		if guarded && gc.MarkAuthenticated() != nil {
			return s.Accept() // closed: over the bound (plaintext: tests only)
		}
		return c, nil
	}
	if !guarded {
		return tls.Server(c, s.server), nil
	}
	cfg := s.server.Clone()
	verify := cfg.VerifyConnection
	cfg.VerifyConnection = func(cs tls.ConnectionState) error {
		if verify != nil {
			if err := verify(cs); err != nil {
				return err
			}
		}
		if len(cs.PeerCertificates) == 0 {
			return nil // not mutual: stays unauthenticated
		}
		return gc.MarkAuthenticated()
	}
	return tls.Server(c, cfg), nil
}
