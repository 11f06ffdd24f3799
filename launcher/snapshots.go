package launcher

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/sync/errgroup"

	"github.com/gotrain/gotrain/internal/memsnap"
)

// The in-memory snapshot tier (issue 29): the agent keeps each local rank's
// newest training-state snapshot in memory that outlives the worker
// (package memsnap), on a socket beside the workers' gRPC socket. This file
// is the whole hook into the agent: it starts the store with the agent's
// other subsystems and lets only the worker the agent started as a rank
// keep that rank's snapshots.

// startSnapshots serves the snapshot socket in dir until ctx ends. The
// store lives as long as the agent: across the generations its workers
// come and go in.
func (a *agent) startSnapshots(ctx context.Context, g *errgroup.Group, dir string) {
	limit := a.cfg.SnapshotMemory
	if limit == 0 {
		limit = defaultSnapshotMemory()
	}
	lis, err := memsnap.Listen(filepath.Join(dir, memsnap.SocketName))
	if err != nil {
		a.log.Warn("no in-memory snapshots: restarted ranks resume from their disk checkpoints", "err", err)
		return
	}
	// The Python module, where workers' interpreters find it (last on
	// PYTHONPATH: the program's own modules come first).
	if err := os.MkdirAll(a.pyDir, 0o700); err == nil && os.WriteFile(filepath.Join(a.pyDir, memsnap.PythonModuleName), memsnap.PythonModule, 0o600) == nil {
		a.pyPath = a.pyDir
	}
	st := memsnap.NewStore(limit)
	srv := &memsnap.Server{Store: st, Token: a.cfg.JobToken, Authorize: a.claims.AuthorizeSnapshots, Log: a.log.With("component", "snapshots")}
	if p := a.startSnapshotPeers(ctx, g, st); p != nil { // snappeer.go
		a.snapPeers = p
		srv.Committed, srv.Fetch = p.replicate, p.fetch
	}
	g.Go(func() error {
		defer st.Close()
		return srv.Serve(ctx, lis)
	})
}

// snapshotPythonPath appends dir (none when "") to env's PYTHONPATH.
func snapshotPythonPath(env []string, dir string) []string {
	if dir == "" {
		return env
	}
	for i := len(env) - 1; i >= 0; i-- {
		if v, ok := strings.CutPrefix(env[i], "PYTHONPATH="); ok {
			if v != "" {
				dir = v + string(os.PathListSeparator) + dir
			}
			out := slices.Clone(env)
			out[i] = "PYTHONPATH=" + dir
			return out
		}
	}
	return append(env, "PYTHONPATH="+dir)
}

// defaultSnapshotMemory is --snapshot-memory's default: a quarter of the
// node's memory.
func defaultSnapshotMemory() int64 {
	if n := memsnap.TotalMemory(); n > 0 {
		return n / 4
	}
	return 16 << 30
}
