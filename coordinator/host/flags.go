package host

import (
	"flag"

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
	FlagRendezvousTimeout = "rendezvous-timeout"
	FlagMetricsAddr       = "metrics-addr"
	FlagNoGossip          = "no-gossip"
)

// RegisterJobFlags registers on fs the flags of the job-wide settings, bound
// to s, with DefaultJobSettings' defaults: `gotrain coordinator` and
// `gotrain launch` both call it, so their names, help and defaults cannot
// differ. token is --job-token's default (cmd/gotrain gives
// $GOTRAIN_JOB_TOKEN; this package reads no environment).
func RegisterJobFlags(fs *flag.FlagSet, s *JobSettings, token string) {
	d := DefaultJobSettings()
	fs.IntVar(&s.Nodes, FlagNodes, d.Nodes, "number of nodes (agents) the job waits for")
	fs.StringVar(&s.JobToken, FlagJobToken, token, "secret every agent and worker of the job presents (default $"+jobenv.JobToken+", or a new one, printed, where the coordinator starts)")
	fs.StringVar(&s.RunID, FlagRunID, d.RunID, "job name shown to workers as GOTRAIN_RUN_ID / TORCHELASTIC_RUN_ID (default: derived from the token)")
	fs.IntVar(&s.MaxRestarts, FlagMaxRestarts, d.MaxRestarts, "restart the job this many times after a worker fails (0: the first failure ends the job)")
	fs.DurationVar(&s.RestartBackoff, FlagRestartBackoff, d.RestartBackoff, "pause between the last worker of a failed generation stopping and the next generation starting")
	fs.DurationVar(&s.HangTimeout, FlagHangTimeout, d.HangTimeout, "declare a hang when no collective completes for this long while a rank waits in one; gotrain diagnose shows the verdict")
	fs.StringVar(&s.OnHang, FlagOnHang, d.OnHang, "on a hang: report (log the verdict, keep waiting) or restart (end the generation like a failure; restarts while --max-restarts allows)")
	fs.DurationVar(&s.RendezvousTimeout, FlagRendezvousTimeout, d.RendezvousTimeout, "with --nnodes > 1, where the coordinator runs: fail the job when not every node has joined by then (0: wait forever)")
	fs.StringVar(&s.MetricsAddr, FlagMetricsAddr, d.MetricsAddr, "serve the coordinator's Prometheus /metrics on HOST:PORT (e.g. 0.0.0.0:9400, or 127.0.0.1:0 for a free port, printed); default off")
	fs.BoolVar(&s.NoGossip, FlagNoGossip, d.NoGossip, "with --nnodes > 1: do not gossip; a dead node is then found by its broken connection only (about 20 s)")
}
