package launcher

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"time"

	"github.com/gotrain/gotrain/internal/jobenv"
	"github.com/gotrain/gotrain/internal/token"
)

// Config is one agent's job. Zero fields take the defaults noted.
type Config struct {
	// NprocPerNode is how many workers this node runs (required, ≥ 1).
	NprocPerNode int
	// Backend is the data plane workers use: "cpu" or "nccl" (required).
	Backend string
	// Program and Args are the worker command line.
	Program string
	Args    []string
	// Env is the workers' base environment; gotrain's variables are added.
	Env []string
	// LogDir, when set, receives one log file per rank.
	LogDir string

	// Nodes is how many agents the job waits for (default 1).
	Nodes int
	// Coordinator is the address of the job's coordinator. Empty: this agent
	// starts one, listening on CoordinatorListen.
	Coordinator string
	// CoordinatorListen is where an embedded coordinator listens (default
	// 127.0.0.1:0 on one node, 0.0.0.0:29400 with several).
	CoordinatorListen string
	// NodeAddress is the address other nodes reach this one at (default
	// 127.0.0.1 on one node, else the first non-loopback IPv4 address).
	NodeAddress string
	// JoinTimeout bounds how long the agent tries to reach the coordinator
	// (default 60s).
	JoinTimeout time.Duration
	// RendezvousTimeout bounds how long an embedded coordinator waits for
	// all Nodes to join; then the job fails, naming the nodes that did.
	// 0 waits forever.
	RendezvousTimeout time.Duration

	// JobToken authenticates every call (default: a new random token, which
	// only works when this agent starts the coordinator).
	JobToken string
	// RunID names the job (default: derived from the token).
	RunID string
	// MaxRestarts is how many times the job restarts after a failure (default 0).
	MaxRestarts int
	// RestartBackoff is the pause between a failed generation's last worker
	// stopping and the next generation starting (default 0).
	RestartBackoff time.Duration
	// GracePeriod is how long workers get between SIGTERM and SIGKILL
	// (default 10s).
	GracePeriod time.Duration
	// HangTimeout and OnHang configure the embedded coordinator's hang
	// detector (defaults 120s and "report"; see coordinator/job).
	HangTimeout time.Duration
	OnHang      string
	// GossipPort is this agent's memberlist port (default 0: any free port).
	// The embedded coordinator gossips at its own port + 1 (gossip.go).
	GossipPort int
	// NoGossip turns gossip-based failure detection off: lost nodes are
	// found by their broken streams and gRPC keepalive only (about 20 s).
	// Jobs of one node never gossip.
	NoGossip bool
	// MetricsAddr is where the embedded coordinator serves Prometheus
	// /metrics (e.g. 127.0.0.1:0 for a free port); empty: no metrics.
	MetricsAddr string

	// ReaperCommand starts the orphan reaper (see reaper.go), e.g.
	// [gotrain, _reaper]. Empty: no reaper; workers are still killed by
	// PDEATHSIG when the agent dies, but not the processes they started.
	ReaperCommand []string

	// Standby keeps one warmed-up spare process of the program per local
	// slot and hands a rank that needs a new process to it (standby.go).
	// The program must use package worker. StandbyAuto, the default of
	// gotrain launch, does so on the NCCL backend once every worker of the
	// node has attached with package worker, so that other programs never
	// get a spare; the zero value is StandbyOff.
	Standby StandbyMode
	// StandbyTimeout is how long a standby may take to say hello before the
	// program is taken not to support standbys (default 30s).
	StandbyTimeout time.Duration

	// Signals delivers the signals the agent received (SIGINT, SIGTERM stop
	// the job; SIGUSR1, SIGUSR2 and SIGHUP are passed on to workers).
	Signals <-chan os.Signal
	// Stdout and Stderr receive the workers' prefixed output (default os.Stdout, os.Stderr).
	Stdout, Stderr io.Writer
	Logger         *slog.Logger
}

func (c *Config) setDefaults() error {
	if c.Nodes == 0 {
		c.Nodes = 1
	}
	single := c.Nodes == 1 && c.Coordinator == ""
	if c.CoordinatorListen == "" {
		if single {
			c.CoordinatorListen = "127.0.0.1:0"
		} else {
			c.CoordinatorListen = "0.0.0.0:29400"
		}
	}
	if c.NodeAddress == "" {
		if single {
			c.NodeAddress = "127.0.0.1"
		} else {
			addr, err := OutboundAddress()
			if err != nil {
				return err
			}
			c.NodeAddress = addr
		}
	}
	if c.JoinTimeout == 0 {
		c.JoinTimeout = 60 * time.Second
	}
	if c.GracePeriod == 0 {
		c.GracePeriod = 10 * time.Second
	}
	if c.StandbyTimeout == 0 {
		c.StandbyTimeout = 30 * time.Second
	}
	if c.JobToken == "" {
		if c.Coordinator != "" {
			return errors.New("joining a coordinator needs its job token: pass --job-token or set " + jobenv.JobToken)
		}
		c.JobToken = token.Generate()
	}
	if c.RunID == "" {
		c.RunID = "gotrain-" + c.JobToken[:min(8, len(c.JobToken))]
	}
	if c.Stdout == nil {
		c.Stdout = os.Stdout
	}
	if c.Stderr == nil {
		c.Stderr = os.Stderr
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return nil
}

func (c *Config) validate() error {
	switch {
	case c.NprocPerNode < 1:
		return fmt.Errorf("--nproc-per-node must be at least 1, got %d", c.NprocPerNode)
	case c.Backend != "cpu" && c.Backend != "nccl":
		return fmt.Errorf("--backend must be cpu or nccl, got %q", c.Backend)
	case c.Program == "":
		return errors.New("no program to run: put it after `--`, e.g. gotrain launch --nproc-per-node 2 -- ./train")
	case c.Nodes < 1:
		return fmt.Errorf("--nnodes must be at least 1, got %d", c.Nodes)
	case c.MaxRestarts < 0:
		return fmt.Errorf("--max-restarts must not be negative, got %d", c.MaxRestarts)
	case c.GracePeriod < 0:
		return fmt.Errorf("--grace-period must not be negative, got %s", c.GracePeriod)
	case c.Standby != StandbyOff && c.Standby != StandbyOn && c.Standby != StandbyAuto && c.Standby != "":
		return fmt.Errorf("--standby must be on, off or auto, got %q", string(c.Standby))
	case c.StandbyTimeout < 0:
		return fmt.Errorf("--standby-timeout must not be negative, got %s", c.StandbyTimeout)
	case c.RestartBackoff < 0:
		return fmt.Errorf("--restart-backoff must not be negative, got %s", c.RestartBackoff)
	case c.GossipPort < 0 || c.GossipPort > 65535:
		return fmt.Errorf("--gossip-port must be between 0 and 65535, got %d", c.GossipPort)
	case c.RendezvousTimeout < 0:
		return fmt.Errorf("--rendezvous-timeout must not be negative, got %s", c.RendezvousTimeout)
	case c.MetricsAddr != "" && c.Coordinator != "":
		return errors.New("--metrics-addr is served by the coordinator, and this node joins one at --coordinator: pass --metrics-addr to the node or `gotrain coordinator` that runs it")
	}
	return nil
}
