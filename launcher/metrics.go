package launcher

import (
	"context"
	"fmt"
	"net"

	"github.com/gotrain/gotrain/coordinator"
)

// serveMetrics serves the embedded coordinator's Prometheus /metrics on
// cfg.MetricsAddr until ctx ends, and returns the address it listens on;
// "" when metrics are off.
func (a *agent) serveMetrics(ctx context.Context, srv *coordinator.Server) (string, error) {
	if a.cfg.MetricsAddr == "" {
		return "", nil
	}
	lis, err := net.Listen("tcp", a.cfg.MetricsAddr)
	if err != nil {
		return "", fmt.Errorf("serve metrics on %s: %w (pick another with --metrics-addr)", a.cfg.MetricsAddr, err)
	}
	go func() {
		if err := srv.ServeMetrics(ctx, lis); err != nil {
			a.log.Warn("metrics", "err", err)
		}
	}()
	addr := lis.Addr().String()
	fmt.Fprintf(a.cfg.Stderr, "gotrain: metrics at http://%s/metrics\n", addr)
	return addr, nil
}
