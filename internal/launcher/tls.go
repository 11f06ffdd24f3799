package launcher

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"strings"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"

	"github.com/gotrain/gotrain/internal/jobtls"
	"github.com/gotrain/gotrain/internal/leaderconn"
	gotrainv1 "github.com/gotrain/gotrain/proto/gotrain/v1"
)

// dial opens the agent's connection to the coordinator: TLS verified as
// trust says, the proof of the token both ways (the token itself is never
// sent), and the node certificate (nil before Join) presented as the
// node's identity.
func dial(addr string, trust jobtls.Trust, tok string, cert *tls.Certificate) (*grpc.ClientConn, error) {
	creds, err := trust.Credentials(tok, cert)
	if err != nil {
		return nil, err
	}
	conn, err := grpc.NewClient(addr,
		grpc.WithTransportCredentials(creds),
		// Pings find a coordinator that vanished without closing the
		// connection (its machine died, the network split).
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 10 * time.Second, Timeout: 10 * time.Second, PermitWithoutStream: true}),
		grpc.WithConnectParams(connectParams))
	if err != nil {
		return nil, fmt.Errorf("coordinator address %q: %w", addr, err)
	}
	return conn, nil
}

// connectParams: gRPC's default connect back-off grows to 2 minutes, and
// a connection attempt lasts 20 s: a joiner started before its
// coordinator joined 11–16 s after it listened, and a node cut off for
// less than the node timeout could miss its deadline to reconnect. At most
// a second between attempts, each given 5 s (a TCP and TLS handshake on a
// loaded machine: 3 s failed every attempt at a load of 35 on 2 cores), so
// that a healed network is found within a few seconds.
var connectParams = grpc.ConnectParams{
	Backoff:           backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second},
	MinConnectTimeout: 5 * time.Second,
}

// notVerified says whether err is a coordinator that failed verification
// (another CA, a wrong --ca-hash, a certificate the site's CA did not
// issue): trying again cannot help, and nothing was sent.
func notVerified(err error) bool {
	m := status.Convert(err).Message()
	return strings.Contains(m, "jobtls: ") || strings.Contains(m, "x509: ") || strings.Contains(m, "tls: failed to verify")
}

// verifyFailure is why the coordinator failed verification, without
// gRPC's `connection error: desc = "transport: ..."` around it.
func verifyFailure(err error) string {
	m := status.Convert(err).Message()
	for _, p := range []string{"jobtls: ", "tls: failed to verify", "x509: "} {
		if i := strings.Index(m, p); i >= 0 {
			return strings.TrimSuffix(m[i:], `"`)
		}
	}
	return m
}

// joinConnected joins over a connection without a node certificate, then
// returns the connection every later call uses: the same trust, and the
// certificate Join issued, to the leader of the coordinator's replicas
// (addrs: one, or several separated by commas; Join names them all).
func (a *agent) joinConnected(ctx context.Context, addrs string, trust jobtls.Trust) (io.Closer, error) {
	if _, err := trust.Credentials(a.cfg.JobToken, nil); err != nil {
		return nil, err // a --tls-ca that cannot be read: no dial would ever succeed
	}
	key, csr, err := jobtls.NewNodeKey()
	if err != nil {
		return nil, err
	}
	list := splitAddrs(addrs) // replicas.go
	lc, err := a.dialCoordinator(list, trust, nil)
	if err != nil {
		return nil, err
	}
	a.coord = gotrainv1.NewCoordinatorClient(lc)
	der, proven, caDER, err := a.join(ctx, addrs, csr)
	a.joinedAt = lc.Leader()
	lc.Close()
	if err != nil {
		return nil, err
	}
	if trust, err = a.learnKeys(trust, proven, caDER); err != nil { // keys.go: pin what was proven
		return nil, fmt.Errorf("join the coordinator at %s: %w", addrs, err)
	}
	cert := jobtls.NodeCertificate(der, key)
	a.nodeCert = &cert
	if a.lc, err = a.dialCoordinator(append(list, a.replicaSet()...), trust, &cert); err != nil {
		return nil, err
	}
	a.coord = gotrainv1.NewCoordinatorClient(a.lc)
	if a.hostReplica {
		a.startHostedReplica(ctx, a.joinedAt) // replicas.go
	}
	return coordConn{a}, nil
}

// dialCoordinator connects to the coordinator's replicas at addrs (a
// single coordinator is a set of one).
func (a *agent) dialCoordinator(addrs []string, trust jobtls.Trust, cert *tls.Certificate) (*leaderconn.Conn, error) {
	var self atomic.Pointer[leaderconn.Conn]                                             // for the switch note, which reads where calls now go
	onSwitch := func(from, to, why string) { a.leaderMoved(self.Load(), from, to, why) } // failover.go
	if cert == nil {
		// Join's connection looks for the leader it joins at: no change
		// of leader, nothing to say.
		onSwitch = func(string, string, string) {}
	} else {
		a.failover.follow(a.joinedAt)
	}
	lc, err := leaderconn.New(addrs, func(addr string) (*grpc.ClientConn, error) {
		return dial(addr, trust, a.cfg.JobToken, cert)
	}, leaderconn.WithOnSwitch(onSwitch),
		leaderconn.WithHintCheck(a.checkHint), // keys.go
		// The heartbeat (one a second) finds a leader cut off by a
		// partition: it moves the calls in flight there to the new one.
		leaderconn.WithProbe(gotrainv1.Coordinator_ReportProgress_FullMethodName, time.Second))
	if err == nil {
		self.Store(lc)
	}
	return lc, err
}
