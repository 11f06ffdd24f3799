package launcher

import (
	"context"
	"fmt"
	"net"

	"github.com/gotrain/gotrain/internal/coordinator/host"
	"github.com/gotrain/gotrain/internal/coordinator/state"
	"github.com/gotrain/gotrain/internal/jobenv"
	"github.com/gotrain/gotrain/internal/runfile"
)

// startCoordinator runs the job's coordinator inside this agent (package
// internal/coordinator/host, as `gotrain coordinator` does), with this agent's
// job-wide settings. stop stops it and waits for every goroutine it started.
func (a *agent) startCoordinator(ctx context.Context) (addr, pin string, stop func(), err error) {
	c, err := host.Start(context.WithoutCancel(ctx), a.coordinatorConfig())
	if err != nil {
		return "", "", nil, fmt.Errorf("start the coordinator: %w", err)
	}
	// This agent calls its coordinator where the others do, never at a
	// wildcard listening address ([::]:29400): that would be printed as
	// the leader, and count as a replica of its own beside this one.
	addr = c.JoinAddr(a.cfg.NodeAddress)
	if id := c.ReplicaID(); id != "" {
		addr = id
	}
	a.hostKey = c.HostKey() // join.go: this node is the job's first
	if line := notReplicatedLine(a.cfg.JobSettings.Replicas(), a.cfg.JobFlagsGiven[host.FlagReplicas], addr); line != "" {
		fmt.Fprintln(a.cfg.Stderr, line)
	}
	if a.metricsAddr = c.MetricsAddr(); a.metricsAddr != "" {
		fmt.Fprintf(a.cfg.Stderr, "gotrain: metrics at http://%s/metrics\n", a.metricsAddr)
	}
	var tokenFile *runfile.File
	if a.cfg.Nodes > 1 && !a.cfg.Scheduled {
		tok := "with " + jobenv.JobToken + " set to this node's job token"
		if a.tokenMade {
			// A token made here has no other copy: it goes to a file only
			// this user can read, never to the terminal or a log.
			if tokenFile, err = runfile.WriteToken(c.Config().RunID, a.cfg.JobToken); err != nil {
				c.Stop()
				return "", "", nil, fmt.Errorf("keep the job token for the other nodes: %w (or set %s on every node)", err, jobenv.JobToken)
			}
			tok = fmt.Sprintf("with %s=$(cat %s): the job token is in that file (mode 0600), copy it to each node", jobenv.JobToken, tokenFile.Path())
		}
		a.joinHint = fmt.Sprintf("gotrain: coordinator listening on %s; start the other %s node(s) with: gotrain launch --nnodes %s --coordinator %s %s ... (%s; it is never printed)",
			addr, a.missing(1), a.nnodes(), c.JoinAddr(a.cfg.NodeAddress), host.VerifyFlags(c.CAHash()), tok)
	}
	return addr, c.Pin(), func() {
		if err := c.Stop(); err != nil {
			a.log.Warn("coordinator", "err", err)
		}
		if tokenFile != nil {
			_ = tokenFile.Remove()
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
	cfg.TLSCert, cfg.TLSKey, cfg.CA = a.cfg.TLSCert, a.cfg.TLSKey, a.cfg.CA
	cfg.Replicas = a.cfg.JobSettings.Replicas() // replicated (Raft) when > 1: internal/coordinator/host's replicas.go
	return cfg
}

// notReplicatedLine says, once, that a coordinator that would be replicated
// is not because it listens on loopback ("" otherwise): only this host
// reaches it, so every node runs here, and replicas beside it would fail
// with it (internal/coordinator/state does not ask for them).
func notReplicatedLine(want int, given bool, addr string) string {
	h, _, err := net.SplitHostPort(addr)
	if want <= 1 || err != nil || !state.IsLoopback(h) {
		return ""
	}
	asked := fmt.Sprintf("the job's %d nodes would have %d", want, want)
	if given {
		asked = fmt.Sprintf("--%s %d asks for %d", host.FlagReplicas, want, want)
	}
	return fmt.Sprintf("gotrain: the coordinator is not replicated (%s): it listens on %s, a loopback address that only this host reaches, so every node runs on this host and replicas here would fail with it; "+
		"for a replicated coordinator run the nodes on separate hosts, with --coordinator-listen on an address they reach", asked, addr)
}
