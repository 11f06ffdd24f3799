package launcher

import (
	"context"
	"fmt"

	"github.com/gotrain/gotrain/coordinator/host"
)

// startCoordinator runs the job's coordinator inside this agent (package
// coordinator/host, as `gotrain coordinator` does), with this agent's
// job-wide settings. stop stops it and waits for every goroutine it started.
func (a *agent) startCoordinator(ctx context.Context) (addr string, stop func(), err error) {
	c, err := host.Start(context.WithoutCancel(ctx), a.coordinatorConfig())
	if err != nil {
		return "", nil, fmt.Errorf("start the coordinator: %w", err)
	}
	addr = c.Addr().String()
	if a.metricsAddr = c.MetricsAddr(); a.metricsAddr != "" {
		fmt.Fprintf(a.cfg.Stderr, "gotrain: metrics at http://%s/metrics\n", a.metricsAddr)
	}
	if a.cfg.Nodes > 1 {
		a.joinHint = fmt.Sprintf("gotrain: coordinator listening on %s; start the other %s node(s) with: gotrain launch --nnodes %s --coordinator %s --job-token %s ...",
			addr, a.missing(1), a.nnodes(), c.JoinAddr(a.cfg.NodeAddress), a.cfg.JobToken)
	}
	return addr, func() {
		if err := c.Stop(); err != nil {
			a.log.Warn("coordinator", "err", err)
		}
	}, nil
}

// coordinatorConfig is the embedded coordinator's configuration: the job's
// settings, listening on --coordinator-listen, gossiping (when the job does)
// at its port + 1 and advertising this node's address, best effort: a
// gossip that cannot start costs only the fast detection of lost nodes.
func (a *agent) coordinatorConfig() host.Config {
	cfg := host.DefaultConfig()
	cfg.JobSettings = a.cfg.JobSettings
	cfg.Listen, cfg.ListenFlag = a.cfg.CoordinatorListen, "--coordinator-listen"
	cfg.GossipPort = host.GossipPortFromListen
	cfg.AdvertiseAddr = func() (string, error) { return a.cfg.NodeAddress, nil }
	cfg.GossipBestEffort = true
	cfg.Logger = a.log.With("component", "coordinator")
	return cfg
}
