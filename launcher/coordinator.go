package launcher

import (
	"context"
	"fmt"
	"net"
	"strconv"

	"github.com/gotrain/gotrain/coordinator"
)

// startCoordinator runs the job's coordinator inside this agent.
func (a *agent) startCoordinator(ctx context.Context) (addr string, stop func(), err error) {
	srv, err := coordinator.New(coordinator.Config{
		RunID: a.cfg.RunID, Token: a.cfg.JobToken,
		Nodes: a.cfg.Nodes, MaxRestarts: a.cfg.MaxRestarts, RestartBackoff: a.cfg.RestartBackoff,
		HangTimeout: a.cfg.HangTimeout, OnHang: a.cfg.OnHang, RendezvousTimeout: a.cfg.RendezvousTimeout,
		Logger: a.log.With("component", "coordinator"),
	})
	if err != nil {
		return "", nil, err
	}
	lis, err := net.Listen("tcp", a.cfg.CoordinatorListen)
	if err != nil {
		return "", nil, fmt.Errorf("start the coordinator on %s: %w (pick another with --coordinator-listen)", a.cfg.CoordinatorListen, err)
	}
	stopGossip := a.startCoordinatorGossip(srv, lis.Addr().(*net.TCPAddr)) // gossip.go; before any Join
	srvCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(srvCtx, lis) }()
	if a.metricsAddr, err = a.serveMetrics(srvCtx, srv); err != nil { // metrics.go
		stopGossip()
		cancel()
		<-done
		return "", nil, err
	}
	addr = lis.Addr().String()
	if a.cfg.Nodes > 1 {
		a.joinHint = fmt.Sprintf("gotrain: coordinator listening on %s; start the other %d node(s) with: gotrain launch --nnodes %d --coordinator %s --job-token %s ...",
			addr, a.cfg.Nodes-1, a.cfg.Nodes, joinAddress(lis.Addr().(*net.TCPAddr), a.cfg.NodeAddress), a.cfg.JobToken)
	}
	return addr, func() { stopGossip(); cancel(); <-done }, nil
}

// joinAddress is where other nodes reach a coordinator listening on lis: the
// listening address itself, or this node's address when it listens on all
// interfaces.
func joinAddress(lis *net.TCPAddr, nodeAddr string) string {
	host := lis.IP.String()
	if lis.IP.IsUnspecified() {
		host = nodeAddr
	}
	return net.JoinHostPort(host, strconv.Itoa(lis.Port))
}
