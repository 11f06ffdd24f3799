package main

import (
	"context"
	"fmt"
	"net"
	"os"

	"github.com/gotrain/gotrain/coordinator"
)

// serveMetrics serves srv's Prometheus /metrics on addr until ctx ends;
// nothing when addr is empty.
func serveMetrics(ctx context.Context, srv *coordinator.Server, addr string) error {
	if addr == "" {
		return nil
	}
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("serve metrics on %s: %w (choose another with --metrics-addr)", addr, err)
	}
	fmt.Fprintf(os.Stderr, "gotrain coordinator: metrics at http://%s/metrics\n", lis.Addr())
	go func() {
		if err := srv.ServeMetrics(ctx, lis); err != nil {
			fmt.Fprintf(os.Stderr, "gotrain coordinator: %v\n", err)
		}
	}()
	return nil
}
