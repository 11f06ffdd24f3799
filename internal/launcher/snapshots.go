package launcher

import (
	"context"
	"net"
	"path/filepath"

	"golang.org/x/sync/errgroup"

	"github.com/gotrain/gotrain/internal/launcher/snaptier"
	"github.com/gotrain/gotrain/internal/memsnap"
	"github.com/gotrain/gotrain/python"
)

// The in-memory snapshot tier (package snaptier): this file is the whole
// hook into the agent: it starts the store and its peer side with the
// agent's other subsystems, with the agent's keys, and lets only the worker
// the agent started as a rank keep that rank's snapshots.

// startSnapshots serves the snapshot socket in dir until ctx ends. The
// store lives as long as the agent: across the generations its workers
// come and go in.
func (a *agent) startSnapshots(ctx context.Context, g *errgroup.Group, dir string) {
	limit := a.cfg.SnapshotMemory
	if limit == 0 {
		limit = snaptier.DefaultMemory()
	}
	lis, err := memsnap.Listen(filepath.Join(dir, memsnap.SocketName))
	if err != nil {
		a.log.Warn("no in-memory snapshots: restarted ranks resume from their disk checkpoints", "err", err)
		return
	}
	// The Python package, where workers' interpreters find it (last on
	// PYTHONPATH: the program's own modules, and an installed gotrain,
	// come first).
	if err := python.WriteTo(a.pyDir); err == nil {
		a.pyPath = a.pyDir
	} else {
		a.log.Warn("gotrain's Python package is not on the workers' path: `import gotrain` fails there unless it is installed", "err", err)
	}
	st := memsnap.NewStore(limit)
	srv := &memsnap.Server{Store: st, Token: a.cfg.JobToken, Authorize: a.claims.AuthorizeSnapshots, Log: a.log.With("component", "snapshots")}
	if p := a.startSnapshotPeers(ctx, g, st); p != nil {
		a.snapPeers = p
		srv.Committed, srv.Fetch = p.Replicate, p.Fetch
	}
	g.Go(func() error {
		defer st.Close()
		return srv.Serve(ctx, lis)
	})
}

// startSnapshotPeers serves the peer side of st; nil when the agent has no
// node certificate or job CA (a coordinator without one: tests) or cannot
// listen: snapshots then stay on this node.
func (a *agent) startSnapshotPeers(ctx context.Context, g *errgroup.Group, st *memsnap.Store) *snaptier.Peers {
	a.keysMu.Lock()
	ca := a.jobCA
	a.keysMu.Unlock()
	if a.nodeCert == nil || ca == nil {
		a.log.Info("no peer replicas of snapshots: the coordinator issued no node certificate")
		return nil
	}
	host := a.cfg.NodeAddress
	if host == "" {
		host = "127.0.0.1"
	}
	lis, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		a.log.Warn("no peer replicas of snapshots: a replaced node's ranks resume from their disk checkpoints", "err", err)
		return nil
	}
	p := snaptier.NewPeers(ctx, st, a.nodeID, a.coord, ca, *a.nodeCert, a.cfg.JobToken, a.log.With("component", "snapshot-peers"))
	a.snapPeerAddr = lis.Addr().String()
	a.log.Info("snapshot peer port listening", "addr", a.snapPeerAddr)
	cert := *a.nodeCert
	g.Go(func() error {
		defer p.Close()
		return p.Serve(ctx, lis, a.cfg.JobToken, ca, cert)
	})
	return p
}
