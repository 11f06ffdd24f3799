package host

import (
	"time"

	"github.com/gotrain/gotrain/internal/connguard"
)

// Connection bounds of the coordinator's ports: idle connections used up the hosting agent's file descriptors,
// and an outsider holding the old single bound full kept every node out.
// Each port is a connguard.Listener: unauthenticated connections have a
// budget of their own, with a handshake deadline, and evict each other by
// source; an authenticated one is out of their reach.
const (
	// MaxConns bounds the authenticated connections of the gRPC port: two
	// per node at most (the Join connection, then the node's own) for 4096
	// nodes (the scale benchmark found 1024 refusing every larger job).
	MaxConns = 8192
	// MaxConnsPerIP bounds those from one remote address (an agent holds
	// one or two; gotrain top and diagnose one each): enough for 128 agents
	// on one machine, or behind one NAT address, which 64 refused.
	MaxConnsPerIP = 512
	// MaxPendingConns bounds the gRPC port's connections that have not yet
	// made a call with the job's credentials, MaxPendingConnsPerIP those
	// from one address: a joiner's connection makes its call within
	// milliseconds, so past a burst of joins these are a flood's. The
	// per-address bound lets the 128 agents of one machine (or NAT
	// address) connect at once, twice over; a flood from other addresses
	// evicts its own connections before any of theirs (connguard).
	MaxPendingConns      = 1024
	MaxPendingConnsPerIP = 512
	// AuthTimeout closes a gRPC connection that made no call with the
	// job's credentials within it: a silent TCP connection, a TLS or HTTP/2
	// handshake left half done, a stream whose request never comes.
	AuthTimeout = 10 * time.Second
	// grpcIdle closes a connection that sent nothing at all for it, a
	// backstop: the server pings a silent connection every 10 s and drops
	// it when no answer comes (internal/coordinator/limits.go).
	grpcIdle = time.Minute

	// MaxMetricsConns and MaxMetricsConnsPerIP bound /metrics (nobody
	// authenticates there: a scraper holds one connection, so a flood
	// evicts its own); the HTTP server's timeouts close slow ones
	// (internal/coordinator/metrics.go).
	MaxMetricsConns      = 256
	MaxMetricsConnsPerIP = 16
)

// GRPCLimits are the coordinator's gRPC port's bounds.
var GRPCLimits = connguard.Limits{
	Unauthenticated: MaxPendingConns, UnauthenticatedPerSource: MaxPendingConnsPerIP, HandshakeTimeout: AuthTimeout,
	Authenticated: MaxConns, AuthenticatedPerSource: MaxConnsPerIP, IdleTimeout: grpcIdle,
}

// MetricsLimits are /metrics's bounds.
var MetricsLimits = connguard.Limits{Unauthenticated: MaxMetricsConns, UnauthenticatedPerSource: MaxMetricsConnsPerIP}
