package launcher

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"time"

	"github.com/gotrain/gotrain/internal/coordinator/host"
	"github.com/gotrain/gotrain/internal/jobenv"
	"github.com/gotrain/gotrain/internal/jobtls"
	"github.com/gotrain/gotrain/internal/launcher/agentcore"
	"github.com/gotrain/gotrain/internal/launcher/output"
	"github.com/gotrain/gotrain/internal/token"
)

// Config is one agent's job. Zero fields take the defaults noted.
type Config struct {
	// Scheduled: a scheduler (Slurm) tells every node its coordinator and
	// credentials, so the first node prints no command for the others.
	Scheduled bool
	// NprocPerNode is how many workers this node runs (required, ≥ 1).
	NprocPerNode int
	// RanksPerGPU is how many workers may share one GPU (NCCL ≥ 2.30's
	// multi-rank-per-GPU: workers get NCCL_MULTI_RANK_GPU_ENABLE=1);
	// 0 or 1: one worker per GPU.
	RanksPerGPU int
	// Backend is the data plane workers use: "cpu" or "nccl" (required).
	Backend string
	// Program and Args are the worker command line.
	Program string
	Args    []string
	// Env is the workers' base environment; gotrain's variables are added.
	Env []string
	// LogDir, when set, receives one log file per rank.
	LogDir string
	// Output is how the workers' output is printed (internal/launcher/output); the zero
	// value prefixes every line with its rank and prints all of it.
	Output output.Options
	// MasterPort, when not 0, is the MASTER_PORT this node offers for rank
	// 0's TCPStore (torchrun's --master-port on one node); 0: a free port.
	MasterPort int
	// Role is the workers' ROLE_NAME (torchrun's --role); "": "default".
	Role string
	// Stdin, when not nil, is the one rank's stdin in a job that can only
	// have one (one worker, one node); nil or a larger job: /dev/null.
	Stdin *os.File
	// RetryPermanent restarts after a failure that can only repeat (the
	// program cannot be executed, a Python import error: explain/permanent.go)
	// too; without it such a failure ends the job.
	RetryPermanent bool

	// JobSettings are the job-wide settings (package internal/coordinator/host):
	// Nodes, JobToken, RunID, MaxRestarts, RestartBackoff, HangTimeout,
	// OnHang, RendezvousTimeout, MetricsAddr, NoGossip. The embedded
	// coordinator runs with them; a joining agent sends those named in
	// JobFlagsGiven, and the coordinator refuses the Join when one
	// contradicts the job. Zero values: see host.JobSettings (0 restarts;
	// gotrain launch's flags give host.DefaultJobSettings).
	host.JobSettings
	// JobFlagsGiven names the job-wide flags given on the command line
	// (flag.FlagSet.Visit in cmd/gotrain); only their settings are checked
	// against the job's when joining, never defaults.
	JobFlagsGiven map[string]bool

	// NodeRank, when not nil, is this node's place as its scheduler numbers
	// the nodes (Slurm's SLURM_NODEID): the coordinator orders the nodes by
	// it, after the node that runs the coordinator. Nil: none (join order).
	NodeRank *int

	// Coordinator is the address of the job's coordinator. Empty: this agent
	// starts one, listening on CoordinatorListen.
	Coordinator string
	// CoordinatorListen is where an embedded coordinator listens (default
	// 127.0.0.1:0 on one node, 0.0.0.0:29400 with several).
	CoordinatorListen string
	// NodeAddress is the address other nodes reach this one at (default
	// 127.0.0.1 on one node, else the first non-loopback IPv4 address).
	NodeAddress string
	// Trust is how a joining agent (Coordinator set) verifies the
	// coordinator besides the proof of the token that every connection
	// makes: the CA hash the first node printed, the site's CA file, or
	// none (the CA found at Join is pinned then). An agent that starts the
	// coordinator pins its own.
	Trust jobtls.Trust
	// TLSCert and TLSKey, when set, are the certificate of the site's PKI
	// that the embedded coordinator presents (see host.Config).
	TLSCert, TLSKey string
	// CA, when not nil, is the job CA the embedded coordinator uses instead
	// of a new one: a caller that must hand the CA's hash out before the
	// coordinator starts (a Slurm step's head) makes it (jobtls.NewCA).
	CA *jobtls.CA
	// JoinTimeout bounds how long the agent tries to reach the coordinator
	// (default 60s).
	JoinTimeout time.Duration

	// SnapshotMemory bounds the bytes of in-memory training-state snapshots
	// the agent holds (snapshots.go); 0: a quarter of the node's memory.
	SnapshotMemory int64

	// GracePeriod is how long workers get between SIGTERM and SIGKILL
	// (default 10s).
	GracePeriod time.Duration
	// GossipPort is this agent's memberlist port (default 0: any free port).
	// The embedded coordinator gossips at its own port + 1.
	GossipPort int

	// ReaperCommand starts the orphan reaper (see reaper.go), e.g.
	// [gotrain, _reaper]. Empty: no reaper; workers are still killed by
	// PDEATHSIG when the agent dies, but not the processes they started.
	ReaperCommand []string

	// Standby keeps one warmed-up spare process of the program per local
	// slot and hands a rank that needs a new process to it (relay/standby.go).
	// The program must use package worker. StandbyAuto, the default of
	// gotrain launch, does so on the NCCL backend once every worker of the
	// node has attached with package worker, so that other programs never
	// get a spare; the zero value is StandbyOff.
	Standby StandbyMode
	// StandbyTimeout is how long a standby may take to say hello before the
	// program is taken not to support standbys (default 30s).
	StandbyTimeout time.Duration
	// StandbyPreload are the modules a Python standby imports besides torch
	// and torch.distributed (internal/launcher/pystandby).
	StandbyPreload []string

	// Preflight proves this node before it joins (preflight.go); nil:
	// none (--preflight off).
	Preflight *Preflight

	// Signals delivers the signals the agent received (SIGINT, SIGTERM stop
	// the job; SIGUSR1, SIGUSR2 and SIGHUP are passed on to workers).
	Signals <-chan os.Signal
	// Stdout and Stderr receive the workers' prefixed output (default os.Stdout, os.Stderr).
	Stdout, Stderr io.Writer
	Logger         *slog.Logger
}

func (c *Config) setDefaults() error {
	if c.Nodes == 0 {
		c.Nodes = host.DefaultNodes
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
	c.JobSettings = c.JobSettings.WithDefaults() // the hang detector's defaults; the run id comes from the coordinator (Join)
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
	if err := c.JobSettings.Validate(); err != nil {
		return err
	}
	switch {
	case c.NprocPerNode < 1:
		return fmt.Errorf("--nproc-per-node must be at least 1, got %d", c.NprocPerNode)
	case c.Backend != "cpu" && c.Backend != "nccl":
		return fmt.Errorf("--backend must be cpu or nccl, got %q", c.Backend)
	case c.Program == "":
		return errors.New("no program to run: put it after `--`, e.g. gotrain launch --nproc-per-node 2 -- ./train")
	case c.GracePeriod < 0:
		return fmt.Errorf("--grace-period must not be negative, got %s", c.GracePeriod)
	case c.Standby != StandbyOff && c.Standby != StandbyOn && c.Standby != StandbyAuto && c.Standby != "":
		return fmt.Errorf("--standby must be on, off or auto, got %q", string(c.Standby))
	case c.StandbyTimeout < 0:
		return fmt.Errorf("--standby-timeout must not be negative, got %s", c.StandbyTimeout)
	case c.SnapshotMemory < 0:
		return fmt.Errorf("--snapshot-memory must not be negative, got %d bytes", c.SnapshotMemory)
	case c.Output.Mode != "" && c.Output.Mode != output.Prefixed && c.Output.Mode != output.Raw:
		return fmt.Errorf("--output must be prefixed or raw, got %q", string(c.Output.Mode))
	case c.Output.HidesAny() && c.LogDir == "":
		return errors.New("--redirects and --console-ranks keep output off the console, into the ranks' log files: give --log-dir DIR")
	case c.MasterPort < 0 || c.MasterPort > 65535:
		return fmt.Errorf("--store-port must be between 1 and 65535 (0: a free port), got %d", c.MasterPort)
	case c.GossipPort < 0 || c.GossipPort > 65535:
		return fmt.Errorf("--gossip-port must be between 0 and 65535, got %d", c.GossipPort)
	case c.MetricsAddr != "" && c.Coordinator != "":
		return errors.New("--metrics-addr is served by the coordinator, and this node joins one at --coordinator: pass --metrics-addr to the node or `gotrain coordinator` that runs it")
	}
	return nil
}

// CheckProgram finds program as Run will (resolveProgram), so that a
// caller can refuse a typo as bad input before anything starts or waits.
func CheckProgram(program string) error {
	_, _, err := resolveProgram(program, nil, io.Discard)
	return err
}

// StandbyMode says when the agent keeps hot standbys (agentcore.StandbyMode;
// the standbys' streams: relay/standby.go).
type StandbyMode = agentcore.StandbyMode

const (
	StandbyOff  = agentcore.StandbyOff
	StandbyOn   = agentcore.StandbyOn
	StandbyAuto = agentcore.StandbyAuto
)

// ParseStandbyMode reads --standby's value: on, off or auto (true and false
// too, for the bare flag).
func ParseStandbyMode(s string) (StandbyMode, error) {
	switch s {
	case "on", "true":
		return StandbyOn, nil
	case "off", "false":
		return StandbyOff, nil
	case "auto":
		return StandbyAuto, nil
	}
	return "", fmt.Errorf("--standby %q: want on, off or auto", s)
}
