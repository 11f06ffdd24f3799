package snaptier

import (
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"

	"github.com/gotrain/gotrain/internal/connguard"
)

// Connection bounds of the snapshot peer port, as the coordinator's, Raft's
// and gossip's ports have them: without them a flood of silent TCP
// connections, open in every multi-node job, took the agent's 20000
// descriptors in seconds, and the next worker crash could not be restarted
// (open /dev/null: too many open files). A connection is unauthenticated
// until one of its calls passed the token, certificate and membership
// checks (access.go); until then it has PeerAuthTimeout and a budget where
// a flood evicts its own connections first (connguard). An agent holds one
// connection to each peer it replicates to or fetches from, and up to 8
// more while it fetches a large replica in ranges.
const (
	MaxPeerPending          = 256
	MaxPeerPendingPerSource = 32
	// PeerAuthTimeout closes a connection that made no call that passed
	// within it: TLS, the proof of the token and the first call take
	// milliseconds between agents.
	PeerAuthTimeout = 10 * time.Second
	// MaxPeerConns bounds the authenticated connections: 9 per node for
	// 100 nodes fetching from this one at once; MaxPeerConnsPerSource
	// those of one address (a few agents behind one address).
	MaxPeerConns          = 1024
	MaxPeerConnsPerSource = 64
	// peerIdle closes a connection that sent nothing for it, a backstop:
	// the server pings a connection silent for peerKeepalive and drops it
	// when no answer comes (a live agent's connection answers, so pooled
	// connections between replicas stay); peerConnIdle closes, gracefully,
	// one without calls for that long (the client dials again on demand).
	peerIdle          = 2 * time.Minute
	peerKeepalive     = 30 * time.Second
	peerKeepaliveWait = 10 * time.Second
	peerConnIdle      = 5 * time.Minute
)

// PeerLimits are the snapshot peer port's bounds.
var PeerLimits = connguard.Limits{
	Unauthenticated: MaxPeerPending, UnauthenticatedPerSource: MaxPeerPendingPerSource, HandshakeTimeout: PeerAuthTimeout,
	Authenticated: MaxPeerConns, AuthenticatedPerSource: MaxPeerConnsPerSource, IdleTimeout: peerIdle,
}

// serverBounds are the peer server's gRPC bounds besides the connections':
// streams per connection (each local rank's replica, and a fetch, one;
// 64 leaves room for a node of many ranks), the handshake deadline and
// keepalive.
func serverBounds() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.MaxConcurrentStreams(64),
		grpc.ConnectionTimeout(PeerAuthTimeout),
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: peerKeepalive, Timeout: peerKeepaliveWait, MaxConnectionIdle: peerConnIdle}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: peerKeepalive / 2, PermitWithoutStream: true}),
	}
}
