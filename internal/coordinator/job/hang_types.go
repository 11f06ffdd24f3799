// The hang detector's types: what the machine reports (Verdict, Culprit,
// HangDetected), what agents answer (EvidenceReported), and its settings.
// How it detects is in hang_detect.go, how it explains in hang_classify.go,
// the English in hang_text.go.

package job

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// VerdictKind classifies a verdict.
type VerdictKind string

const (
	VerdictNeverEntered VerdictKind = "never-entered"
	VerdictMismatch     VerdictKind = "mismatch"
	VerdictStuck        VerdictKind = "stuck"
	VerdictProcess      VerdictKind = "process"
	VerdictStraggler    VerdictKind = "straggler"
)

// What the machine does when it detects a hang (Config.OnHang).
const (
	// OnHangReport reports the verdict and lets the job hang.
	OnHangReport = "report"
	// OnHangRestart also ends the generation through the failure path, which
	// restarts the job while restarts remain.
	OnHangRestart = "restart"
)

// DefaultHangTimeout is the hang timeout while the adaptive one (Config.HangTimeout 0) has
// too few intervals to go by.
const DefaultHangTimeout = 120 * time.Second

// Collective is one collective as a rank issued it.
type Collective struct {
	Seq      int64
	Op       string // "allreduce", "broadcast", "allgather", "reducescatter", "barrier", ...
	DType    string
	Count    int64
	Root     int // broadcast root or point-to-point peer, -1 for none
	ReduceOp string
	State    string // "enqueued", "started", "completed", "failed"
	Enqueued time.Time
}

// Shape describes the collective without its seq: "allreduce (float32 sum,
// 1024 elements)".
func (c Collective) Shape() string {
	if c.Op == "" {
		return "an unknown collective"
	}
	var parts []string
	if c.DType != "" {
		parts = append(parts, strings.TrimSpace(c.DType+" "+c.ReduceOp))
	}
	if c.Count > 0 || c.DType != "" {
		parts = append(parts, plural(int(c.Count), "element"))
	}
	if c.Root >= 0 && c.Op != "allreduce" && c.Op != "allgather" && c.Op != "reducescatter" && c.Op != "barrier" {
		parts = append(parts, fmt.Sprintf("root %d", c.Root))
	}
	if len(parts) == 0 {
		return c.Op
	}
	return fmt.Sprintf("%s (%s)", c.Op, strings.Join(parts, ", "))
}

// signature is what every rank must agree on.
func (c Collective) signature() string {
	return fmt.Sprintf("%s|%s|%d|%d|%s", c.Op, c.DType, c.Count, c.Root, c.ReduceOp)
}

// Culprit is a rank a verdict blames, and what it was doing.
type Culprit struct {
	Rank      int
	NodeID    string
	Hostname  string
	Pid       int
	GPU       int // index on the node, -1 for none
	GPUUUID   string
	ProcState string // "R", "S", "D", "T", "Z", "exited", "" when unknown
	Doing     string
	// Collective is the collective the rank was in, nil if none.
	Collective *Collective
}

// Evidence is what an agent found about a rank: its goroutine stacks, a
// py-spy dump, /proc files, GPU state.
type Evidence struct {
	Rank int
	Pid  int
	Kind string // "goroutines", "py-spy", "proc", "gpu", "error"
	Text string
}

// Verdict is the hang detector's finding for one communicator.
type Verdict struct {
	ID         int64
	Kind       VerdictKind
	Generation int64
	Comm       string
	// Collective is the collective the job is stuck at, as the waiting ranks
	// issued it (Seq is the lowest completed seq + 1).
	Collective Collective
	// Since is when the stall began: the later of the last completion and
	// the first rank's entry into Collective.
	Since    time.Time
	Detected time.Time
	Summary  string
	Details  []string
	Culprits []Culprit
	// Waiting are the ranks that entered Collective and wait in it.
	Waiting  []int
	Evidence []Evidence
	// Timeout is the hang timeout the verdict was made under; Adaptive: it
	// came from the job's rhythm (Config.HangTimeout 0). Zero for a
	// straggler.
	Timeout  time.Duration
	Adaptive bool
	// Straggler is a straggler verdict's figures; nil for the others.
	Straggler *StragglerFigures
}

// StragglerFigures are how much a straggler is slower (internal/coordinator/rhythm).
type StragglerFigures struct {
	// Slower is its extra compute per collective over the others' median,
	// as a fraction (1.5: 150 % slower); Compute its own, Others theirs.
	Slower          float64
	Compute, Others time.Duration
	// LastShare is the fraction of the Common recent collectives it arrived
	// at last; Common is 0 when the workers send no per-collective waits.
	LastShare float64
	Common    int
}

// HangDetected: the detector fired (or a post mortem found a mismatch).
// The caller logs the verdict, tells the agents, and asks the agents named in
// Collect for evidence, answered with [EvidenceReported].
type HangDetected struct {
	Verdict Verdict
	// Collect lists, by node, the ranks whose evidence is wanted; empty when
	// their processes are gone.
	Collect []EvidenceTarget
	// PostMortem: the generation had ended already when the verdict was made.
	PostMortem bool
}

// EvidenceTarget is the ranks of one node to collect evidence of.
type EvidenceTarget struct {
	NodeID string
	Ranks  []int
}

func (HangDetected) isAction() {}

// EvidenceReported: an agent answers a HangDetected's request for evidence.
// Evidence for a verdict no longer in force is dropped.
type EvidenceReported struct {
	NodeID    string
	VerdictID int64
	Evidence  []Evidence
}

func (EvidenceReported) isEvent() {}

func copyVerdict(v Verdict) Verdict {
	v.Details = slices.Clone(v.Details)
	v.Waiting = slices.Clone(v.Waiting)
	v.Evidence = slices.Clone(v.Evidence)
	v.Culprits = slices.Clone(v.Culprits)
	if v.Straggler != nil {
		f := *v.Straggler
		v.Straggler = &f
	}
	for i, c := range v.Culprits {
		if c.Collective != nil {
			cc := *c.Collective
			v.Culprits[i].Collective = &cc
		}
	}
	return v
}
