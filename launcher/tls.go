package launcher

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"

	"github.com/gotrain/gotrain/internal/jobtls"
	"github.com/gotrain/gotrain/internal/token"
	gotrainv1 "github.com/gotrain/gotrain/proto/gotrain/v1"
)

// errNoTrust is a joining agent given no way to verify the coordinator.
var errNoTrust = errors.New("joining a coordinator needs a way to verify it before the job token is sent: " +
	"pass the --ca-hash sha256:... that the first node (or `gotrain coordinator`) printed, " +
	"or --tls-ca FILE when the coordinator has a certificate of your site's PKI; " +
	"--insecure-skip-ca-check sends the token to whatever answers at --coordinator (anyone on the path can pose as the coordinator and take it)")

// dial opens the agent's connection to the coordinator: TLS verified as
// trust says, the token on every call, and the node certificate (nil
// before Join) presented as the node's identity.
func dial(addr string, trust jobtls.Trust, tok string, cert *tls.Certificate) (*grpc.ClientConn, error) {
	creds, err := trust.Credentials(cert)
	if err != nil {
		return nil, err
	}
	conn, err := grpc.NewClient(addr,
		grpc.WithTransportCredentials(creds),
		token.DialOption(tok),
		// Pings find a coordinator that vanished without closing the
		// connection (its machine died, the network split).
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 10 * time.Second, Timeout: 10 * time.Second, PermitWithoutStream: true}))
	if err != nil {
		return nil, fmt.Errorf("coordinator address %q: %w", addr, err)
	}
	return conn, nil
}

// notVerified says whether err is a coordinator that failed verification
// (another CA, a wrong --ca-hash, a certificate the site's CA did not
// issue): trying again cannot help, and nothing was sent.
func notVerified(err error) bool {
	m := status.Convert(err).Message()
	return strings.Contains(m, "jobtls: ") || strings.Contains(m, "x509: ") || strings.Contains(m, "tls: failed to verify")
}

// joinConnected joins over a connection without a node certificate, then
// returns the connection every later call uses: the same trust, and the
// certificate Join issued.
func (a *agent) joinConnected(ctx context.Context, addr string, trust jobtls.Trust) (*grpc.ClientConn, error) {
	key, csr, err := jobtls.NewNodeKey()
	if err != nil {
		return nil, err
	}
	conn, err := dial(addr, trust, a.cfg.JobToken, nil)
	if err != nil {
		return nil, err
	}
	a.coord = gotrainv1.NewCoordinatorClient(conn)
	der, err := a.join(ctx, addr, csr)
	conn.Close()
	if err != nil {
		return nil, err
	}
	cert := jobtls.NodeCertificate(der, key)
	if conn, err = dial(addr, trust, a.cfg.JobToken, &cert); err != nil {
		return nil, err
	}
	a.coord = gotrainv1.NewCoordinatorClient(conn)
	return conn, nil
}
