package state

import (
	"errors"
	"fmt"
	"time"

	"github.com/gotrain/gotrain/internal/coordinator/job"
)

// Entry is one entry of the log: exactly one of Config, Join, KV, Replica
// and Event is set. Time is when the leader took it; every replica applies
// it at that time.
type Entry struct {
	Time    time.Time
	Config  *Config
	Join    *Join
	KV      *KV
	Replica *Replica
	Event   job.Event
}

// Config is the job's configuration as the first leader has it: the first
// entry of the log. Admission's bounds come from it, never from a
// replica's own flags.
type Config struct {
	Job job.Config
	// Peers: the replica set's gRPC addresses when it is fixed
	// (standalone); otherwise the first leader's, and Want is how many
	// replicas the joining nodes are asked to host (embedded).
	Peers []string
	Want  int
	// NprocPerNode bounds the workers of one node, RanksPerJob the ranks
	// of all nodes together.
	NprocPerNode int
	RanksPerJob  int
}

// Join is a node's join.
type Join struct {
	Node job.NodeInfo
	// NodeRank is the node's place as its scheduler numbers the nodes; -1:
	// none given.
	NodeRank int
	Settings Settings
	// Host: the join is of the agent that runs the coordinator (it proved
	// so with the host key, before the log).
	Host bool
	// CSR is the SHA-256 of the join's certificate request: a retried Join
	// repeats it (JoinKey).
	CSR []byte
}

// Settings are the job-wide settings a joining agent was given explicitly
// (nil: not given). Given is false for an agent that sent none.
type Settings struct {
	Given                                          bool
	Nodes, MinNodes, MaxRestarts                   *int
	OnHang, OnStraggler, RunID                     *string
	RestartBackoff, HangTimeout, RendezvousTimeout *time.Duration
	StragglerPersist                               *time.Duration
}

// KV is a put of the KV store (or of the rendezvous store: CommKey).
type KV struct {
	Key   string
	Value []byte
}

// Replica is a replica (gRPC address) added to the set, hosted by Node
// (embedded; "" when standalone).
type Replica struct{ Addr, Node string }

// Result is what applying an entry gave the call that proposed it.
type Result struct {
	Err  error
	Join Joined // of a Join entry
}

// Joined is a Join's answer.
type Joined struct {
	ID          string
	Warnings    []string
	HostReplica bool // the node is asked to host a replica
}

// Out is one event of a node's outbox, numbered from 1 (Seq). Exactly one
// of the others is set.
type Out struct {
	Seq         uint64
	Started     *job.StartGeneration // the node finds its own part in Nodes
	Ended       *job.EndGeneration
	Restarting  *Restart
	Finished    *job.FinishJob
	Replicas    []string
	HostReplica bool
	Evidence    *EvidenceRequest
}

// Restart announces the next generation after a failed one.
type Restart struct {
	Ended       job.EndGeneration
	World       int
	Attempt     int
	MaxAttempts int
	Wait        time.Duration
}

// EvidenceRequest asks a node's agent to collect evidence of a hang for
// Ranks (none: it only prints the verdict).
type EvidenceRequest struct {
	Verdict job.Verdict
	Ranks   []int
}

// Outbox is the generation events of one node present, for its watch
// stream; Closed: the job finished, nothing follows.
type Outbox struct {
	Events []Out
	Closed bool
}

// Effect is what the server does after an entry: one of [Wake], [Drop],
// [Answer], [ArmDeadline], [RemoveVoters], [Finish], [Heard], [KeyPut],
// [Log].
type Effect interface{ isEffect() }

// Wake: node Node's outbox has new events (or closed).
type Wake struct{ Node string }

// Drop: node Node was lost; end its watch stream with Reason.
type Drop struct{ Node, Reason string }

// Answer ends the waiting barrier call Waiter: released, or failed with
// Failed.
type Answer struct {
	Waiter uint64
	Failed string
}

// ArmDeadline: the machine acts at At (a Tick is due then).
type ArmDeadline struct{ At time.Time }

// RemoveVoters: replicas left the set; the leader takes them out of Raft's
// configuration.
type RemoveVoters struct{}

// Finish: the job finished with Result.
type Finish struct{ Result job.FinishJob }

// Heard: node Node reported (its agent is alive, whatever gossip says).
type Heard struct{ Node string }

// KeyPut: key Key of a store has a value now; its waiting readers wake.
type KeyPut struct{ Key string }

// Level is a Log's severity.
type Level int

// Levels of a Log.
const (
	LevelDebug Level = iota
	LevelInfo
	LevelWarn
	LevelError
)

// Log is a line for the server's log (key-value Args, as log/slog takes).
type Log struct {
	Level Level
	Msg   string
	Args  []any
}

func (Wake) isEffect()         {}
func (KeyPut) isEffect()       {}
func (Drop) isEffect()         {}
func (Answer) isEffect()       {}
func (ArmDeadline) isEffect()  {}
func (RemoveVoters) isEffect() {}
func (Finish) isEffect()       {}
func (Heard) isEffect()        {}
func (Log) isEffect()          {}

// Kind is the kind of a Refusal, which the server maps to a status code.
type Kind int

// Kinds of Refusal.
const (
	Invalid      Kind = iota // the request is malformed or over a bound
	Exhausted                // the job is full
	Precondition             // the request contradicts the job
	Internal                 // the log is unusable
)

// Refusal is an entry refused (it changed nothing), or a request that
// admission refuses before the log.
type Refusal struct {
	Kind Kind
	Msg  string
	Err  error // wrapped, when a cause has a sentinel (ErrSettingsMismatch)
}

func (r *Refusal) Error() string { return r.Msg }
func (r *Refusal) Unwrap() error { return r.Err }

func refuse(k Kind, format string, args ...any) error {
	return &Refusal{Kind: k, Msg: fmt.Sprintf(format, args...)}
}

// ErrSettingsMismatch is wrapped by a Join refused because a job-wide
// setting its agent was given contradicts the job's (CheckSettings).
var ErrSettingsMismatch = errors.New("coordinator: job settings differ")
