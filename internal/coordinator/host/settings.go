package host

import (
	"cmp"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"time"

	"github.com/gotrain/gotrain/internal/coordinator/job"
	gotrainv1 "github.com/gotrain/gotrain/proto/gotrain/v1"
)

// The defaults of the job-wide settings, for `gotrain coordinator` and
// `gotrain launch` alike.
const (
	DefaultNodes       = 1
	DefaultMaxRestarts = 3
	// DefaultHangTimeout 0 is the adaptive hang timeout: max(3 x the
	// job's p99 interval between completions, 1s) (internal/coordinator/rhythm).
	DefaultHangTimeout       = 0
	DefaultOnHang            = "report"
	DefaultOnStraggler       = job.OnStragglerReport
	DefaultStragglerPersist  = job.DefaultStragglerPersist
	DefaultRendezvousTimeout = 10 * time.Minute
	// DefaultNodeTimeout: see internal/coordinator/job's membership.go for why 10 s.
	DefaultNodeTimeout = job.DefaultNodeTimeout
	DefaultJoinSettle  = job.DefaultJoinSettle
)

// JobSettings are the settings of the whole job, which the coordinator
// holds: given to `gotrain coordinator`, or to the `gotrain launch` whose
// agent embeds the coordinator. A joining agent sends those it was given
// explicitly (Given), and the coordinator refuses a Join that contradicts
// the job (package coordinator, checkSettings).
//
// DefaultJobSettings has the defaults. Of the zero value, Nodes and OnHang
// take their defaults (WithDefaults); every other zero means what it says:
// no restarts, no backoff, no rendezvous bound, no metrics, the adaptive
// hang timeout.
type JobSettings struct {
	// Config is the job machine's settings, declared once (internal/coordinator/job:
	// the run id, --nnodes MIN:MAX, the node timeout and join settle, the
	// restarts and their backoff, the hang detector, the rendezvous
	// bound): the coordinator takes it as it is. An empty RunID is, where
	// the coordinator starts, a new random one (NewRunID); agents take the
	// coordinator's at Join. RestartCountBase (no flag) is the restarts of
	// earlier runs of the job (a Slurm requeue's SLURM_RESTART_COUNT); only
	// the coordinator's node uses it.
	job.Config
	// JobToken is the secret every agent and worker presents.
	JobToken string
	// MetricsAddr is where the coordinator serves Prometheus /metrics
	// (HOST:PORT; port 0 picks a free one); empty: no metrics.
	MetricsAddr string
	// NoGossip turns gossip-based failure detection off: lost nodes are
	// found by their broken streams and gRPC keepalive only (about 20 s).
	// Jobs of one node never gossip.
	NoGossip bool
	// CoordinatorReplicas is how many replicas of the embedded coordinator
	// the job keeps (replicas.go): the first node's and those of the next
	// nodes to join. 0: 5 when the job may have 5 nodes or more, 3 with
	// 3 or 4, else 1 (Replicas).
	CoordinatorReplicas int
}

// Replicas is CoordinatorReplicas with its default resolved: as etcd and
// Consul advise, 5 replicas from 5 nodes (any two may be lost at once), 3
// with 3 or 4 (any one), none below 3 (a majority of 2 is both).
func (s JobSettings) Replicas() int {
	switch {
	case s.CoordinatorReplicas > 0:
		return s.CoordinatorReplicas
	case s.Nodes >= 5:
		return 5
	case s.Nodes >= 3:
		return 3
	}
	return 1
}

// DefaultJobSettings returns the job-wide settings' defaults: those of the
// flags of both commands (RegisterJobFlags).
func DefaultJobSettings() JobSettings {
	return JobSettings{Config: job.Config{
		Nodes:             DefaultNodes,
		MinNodes:          DefaultNodes,
		NodeTimeout:       DefaultNodeTimeout,
		JoinSettle:        DefaultJoinSettle,
		MaxRestarts:       DefaultMaxRestarts,
		HangTimeout:       DefaultHangTimeout,
		OnHang:            DefaultOnHang,
		OnStraggler:       DefaultOnStraggler,
		StragglerPersist:  DefaultStragglerPersist,
		RendezvousTimeout: DefaultRendezvousTimeout,
	}}
}

// WithDefaults fills the zero fields that have a default other than zero
// (Nodes, OnHang, OnStraggler, ...). It leaves RunID alone: the coordinator makes
// one when it starts (NewRunID), never from the token.
func (s JobSettings) WithDefaults() JobSettings {
	s.Nodes = cmp.Or(s.Nodes, DefaultNodes)
	s.MinNodes = cmp.Or(s.MinNodes, s.Nodes)
	s.NodeTimeout = cmp.Or(s.NodeTimeout, DefaultNodeTimeout)
	s.JoinSettle = cmp.Or(s.JoinSettle, DefaultJoinSettle)
	s.OnHang = cmp.Or(s.OnHang, DefaultOnHang)
	s.OnStraggler = cmp.Or(s.OnStraggler, DefaultOnStraggler)
	s.StragglerPersist = cmp.Or(s.StragglerPersist, DefaultStragglerPersist)
	return s
}

// NewRunID is a job's run id when none is given: "gotrain-" and 8 random
// hex digits. It tells nothing of the job token (the run id
// is shown in logs, TORCHELASTIC_RUN_ID and the unauthenticated /metrics).
func NewRunID() string {
	var b [4]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails on Linux
	return "gotrain-" + hex.EncodeToString(b[:])
}

// ConfigError is a setting that cannot work, named by its flag, and what to
// do instead.
type ConfigError struct {
	Msg  string // e.g. `--on-hang "never"`
	Hint string // e.g. "Use --on-hang report or --on-hang restart."
}

func (e *ConfigError) Error() string { return e.Msg + ": " + e.Hint }

// Validate reports the first setting that cannot work as a *ConfigError.
// It takes the settings as given: a zero Nodes is an error
// (WithDefaults first for a Config built in code).
func (s JobSettings) Validate() error {
	bad := func(msg, hint string) error { return &ConfigError{Msg: msg, Hint: hint} }
	switch {
	case s.Nodes < 1:
		return bad(fmt.Sprintf("--nnodes %d", s.Nodes), "Give at least 1.")
	case s.MinNodes < 0 || s.MinNodes > s.Nodes:
		return bad(fmt.Sprintf("--nnodes %d:%d", s.MinNodes, s.Nodes), "Give MIN:MAX with 1 <= MIN <= MAX, or one number.")
	case s.NodeTimeout < 0:
		return bad(fmt.Sprintf("--node-timeout %s", s.NodeTimeout), "Give a positive duration, e.g. --node-timeout 10s.")
	case s.JoinSettle < 0:
		return bad(fmt.Sprintf("--join-settle %s", s.JoinSettle), "Give a duration of 0 or more.")
	case s.MaxRestarts < 0:
		return bad(fmt.Sprintf("--max-restarts %d", s.MaxRestarts), "Give 0 or more (0: the first failure ends the job).")
	case s.RestartBackoff < 0:
		return bad(fmt.Sprintf("--restart-backoff %s", s.RestartBackoff), "Give a duration of 0 or more.")
	case s.HangTimeout < 0:
		return bad(fmt.Sprintf("--hang-timeout %s", s.HangTimeout), "Give a positive duration, e.g. --hang-timeout 5m, or leave it out for the adaptive timeout.")
	case s.OnHang != "report" && s.OnHang != "restart":
		return bad(fmt.Sprintf("--on-hang %q", s.OnHang), "Use --on-hang report or --on-hang restart.")
	case s.OnStraggler != job.OnStragglerReport && s.OnStraggler != job.OnStragglerReplace:
		return bad(fmt.Sprintf("--on-straggler %q", s.OnStraggler), "Use --on-straggler report (name it only) or --on-straggler replace (restart its rank, or drop its node under --nnodes MIN:MAX).")
	case s.StragglerPersist <= 0:
		return bad(fmt.Sprintf("--straggler-persist %s", s.StragglerPersist), fmt.Sprintf("Give a positive duration, e.g. --straggler-persist %s (the default).", DefaultStragglerPersist))
	case s.CoordinatorReplicas < 0 || s.CoordinatorReplicas > s.Nodes:
		return bad(fmt.Sprintf("--coordinator-replicas %d", s.CoordinatorReplicas), fmt.Sprintf("Give 1 (no replication) up to the job's nodes (%d); 3 survives the loss of any one, 5 of any two.", s.Nodes))
	case s.RendezvousTimeout < 0:
		return bad(fmt.Sprintf("--rendezvous-timeout %s", s.RendezvousTimeout), "Give a duration of 0 or more (0: wait forever).")
	}
	return nil
}

// Given returns the settings whose flags are in given (flag names, from
// flag.FlagSet.Visit), for a joining agent's JoinRequest; nil when none is.
// Only settings that the coordinator checks are sent.
func (s JobSettings) Given(given map[string]bool) *gotrainv1.JobSettings {
	var p gotrainv1.JobSettings
	set := false
	ms := func(d time.Duration) *int64 { set = true; v := d.Milliseconds(); return &v }
	if given[FlagNodes] {
		set = true
		p.Nodes = ptr(int32(s.Nodes))
		p.MinNodes = ptr(int32(cmp.Or(s.MinNodes, s.Nodes)))
	}
	if given[FlagMaxRestarts] {
		set = true
		p.MaxRestarts = ptr(int32(s.MaxRestarts))
	}
	if given[FlagRestartBackoff] {
		p.RestartBackoffMs = ms(s.RestartBackoff)
	}
	if given[FlagHangTimeout] {
		p.HangTimeoutMs = ms(s.HangTimeout)
	}
	if given[FlagOnHang] {
		set = true
		p.OnHang = ptr(s.OnHang)
	}
	if given[FlagOnStraggler] {
		set = true
		p.OnStraggler = ptr(s.OnStraggler)
	}
	if given[FlagStragglerPersist] {
		p.StragglerPersistMs = ms(s.StragglerPersist)
	}
	if given[FlagRendezvousTimeout] {
		p.RendezvousTimeoutMs = ms(s.RendezvousTimeout)
	}
	if given[FlagRunID] {
		set = true
		p.RunId = ptr(s.RunID)
	}
	if !set {
		return nil
	}
	return &p
}

func ptr[T any](v T) *T { return &v }
