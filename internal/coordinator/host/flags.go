package host

import (
	"flag"
	"fmt"
	"strconv"
	"strings"

	"github.com/gotrain/gotrain/internal/jobenv"
)

// The names of the job-wide flags (RegisterJobFlags).
const (
	FlagNodes             = "nnodes"
	FlagJobToken          = "job-token"
	FlagRunID             = "run-id"
	FlagMaxRestarts       = "max-restarts"
	FlagRestartBackoff    = "restart-backoff"
	FlagHangTimeout       = "hang-timeout"
	FlagOnHang            = "on-hang"
	FlagOnStraggler       = "on-straggler"
	FlagStragglerPersist  = "straggler-persist"
	FlagRendezvousTimeout = "rendezvous-timeout"
	FlagMetricsAddr       = "metrics-addr"
	FlagNoGossip          = "no-gossip"
	FlagNodeTimeout       = "node-timeout"
	FlagJoinSettle        = "join-settle"
	FlagReplicas          = "coordinator-replicas"
)

// RegisterJobFlags registers on fs the flags of the job-wide settings, bound
// to s, with DefaultJobSettings' defaults: `gotrain coordinator` and
// `gotrain launch` both call it, so their names, help and defaults cannot
// differ. token is --job-token's default (cmd/gotrain gives
// $GOTRAIN_JOB_TOKEN; this package reads no environment).
func RegisterJobFlags(fs *flag.FlagSet, s *JobSettings, token string) {
	d := DefaultJobSettings()
	s.Nodes, s.MinNodes = d.Nodes, d.MinNodes
	fs.Var(&nnodesFlag{s}, FlagNodes, "nodes (agents) in the job: N, or MIN:MAX (elastic, as torchrun: the job starts with MIN or more, runs on the survivors of a lost node while MIN remain, and admits nodes that join up to MAX)")
	fs.DurationVar(&s.NodeTimeout, FlagNodeTimeout, d.NodeTimeout, "a node out of contact (network blip, frozen agent) for less than this changes nothing; for longer it is lost, and its agent stops its own workers")
	fs.DurationVar(&s.JoinSettle, FlagJoinSettle, d.JoinSettle, "with --nnodes MIN:MAX: wait this long after a join for more before starting (or growing) the job, so a burst of joins is one restart")
	fs.StringVar(&s.JobToken, FlagJobToken, token, "secret every agent and worker of the job presents (default $"+jobenv.JobToken+", or a new one, written to a 0600 run file where the coordinator starts and never printed)")
	fs.StringVar(&s.RunID, FlagRunID, d.RunID, "job name shown to workers as GOTRAIN_RUN_ID / TORCHELASTIC_RUN_ID (default: a random gotrain-XXXXXXXX, made where the coordinator starts)")
	fs.IntVar(&s.MaxRestarts, FlagMaxRestarts, d.MaxRestarts, "restart the job this many times after a worker fails (0: the first failure ends the job)")
	fs.DurationVar(&s.RestartBackoff, FlagRestartBackoff, d.RestartBackoff, "pause between the last worker of a failed generation stopping and the next generation starting")
	fs.DurationVar(&s.HangTimeout, FlagHangTimeout, d.HangTimeout, "declare a hang when no collective completes for this long while a rank waits in one; gotrain diagnose shows the verdict (default 0: adaptive, max(3 x the job's p99 interval between completions, 1s), warm-up left out)")
	fs.StringVar(&s.OnHang, FlagOnHang, d.OnHang, "on a hang: report (log the verdict, keep waiting) or restart (end the generation like a failure; restarts while --max-restarts allows)")
	fs.StringVar(&s.OnStraggler, FlagOnStraggler, d.OnStraggler, "on a straggler (a rank the others wait for): report (log the verdict) or replace (once named for --straggler-persist, restart its rank afresh, on a standby when one is ready, or under --nnodes MIN:MAX drop its node; not counted against --max-restarts; a straggler back on the same rank or host within 10m is only reported)")
	fs.DurationVar(&s.StragglerPersist, FlagStragglerPersist, d.StragglerPersist, "with --on-straggler replace: how long a straggler verdict must stand before its rank is replaced")
	fs.DurationVar(&s.RendezvousTimeout, FlagRendezvousTimeout, d.RendezvousTimeout, "with --nnodes > 1, where the coordinator runs: fail the job when not every node has joined by then (0: wait forever)")
	fs.StringVar(&s.MetricsAddr, FlagMetricsAddr, d.MetricsAddr, "serve the coordinator's Prometheus /metrics on HOST:PORT (e.g. 0.0.0.0:9400, or 127.0.0.1:0 for a free port, printed); default off")
	fs.IntVar(&s.CoordinatorReplicas, FlagReplicas, d.CoordinatorReplicas, "replicas of the coordinator the job keeps (Raft), on the first nodes to join: losing one (or its node) changes nothing; default 5 when --nnodes allows 5 nodes or more (any two may be lost at once), 3 with 3 or 4 (any one), else 1 (not replicated)")
	fs.BoolVar(&s.NoGossip, FlagNoGossip, d.NoGossip, "with --nnodes > 1: do not gossip; a dead node is then found by its broken connection only (about 20 s)")
}

// nnodesFlag is --nnodes: N, or MIN:MAX.
type nnodesFlag struct{ s *JobSettings }

func (f *nnodesFlag) String() string {
	if f.s == nil || f.s.MinNodes == 0 || f.s.MinNodes == f.s.Nodes {
		if f.s == nil {
			return "1"
		}
		return strconv.Itoa(f.s.Nodes)
	}
	return fmt.Sprintf("%d:%d", f.s.MinNodes, f.s.Nodes)
}

func (f *nnodesFlag) Set(v string) error {
	lo, hi, elastic := strings.Cut(v, ":")
	min, err1 := strconv.Atoi(lo)
	max, err2 := min, error(nil)
	if elastic {
		max, err2 = strconv.Atoi(hi)
	}
	if err1 != nil || err2 != nil || min < 1 || max < min {
		return fmt.Errorf("want N or MIN:MAX with 1 <= MIN <= MAX (e.g. 4, or 3:4), got %q", v)
	}
	f.s.MinNodes, f.s.Nodes = min, max
	return nil
}

// ParseNNodes reads --nnodes' value (N or MIN:MAX).
func ParseNNodes(v string) (min, max int, err error) {
	var s JobSettings
	if err := (&nnodesFlag{&s}).Set(v); err != nil {
		return 0, 0, err
	}
	return s.MinNodes, s.Nodes, nil
}
