package job

import "time"

// NodeInfo is what an agent tells the coordinator about its node.
type NodeInfo struct {
	Hostname string
	// Address is where other nodes reach this node (an IP or a resolvable name).
	Address string
	// Nproc is the number of workers the node runs.
	Nproc int
	GPUs  []GPU
	// AgentPID is the agent's process id; with Hostname it identifies an agent.
	AgentPID int
	// FreePort is a TCP port the agent found free; it becomes MASTER_PORT when
	// this node is group rank 0.
	FreePort int
	// RanksPerGPU is how many workers may share one GPU (NCCL 2.30's
	// multi-rank-per-GPU); 0 or 1: one per GPU.
	RanksPerGPU int
	// PreflightFailure: the node failed its preflight checks, as its
	// agent's lines say; "" when it passed or ran none.
	PreflightFailure string
}

// GPU is one GPU of a node.
type GPU struct {
	Index    int
	UUID     string
	PCIBusID string
	Name     string
	NUMANode int
}

// Event is an input to [Machine.Step]: one of [NodeJoined], [NodeLost],
// [WorkerExited], [BarrierArrived], [BarrierCanceled], [ProgressReported] or
// [Tick].
type Event interface{ isEvent() }

// NodeJoined: an agent joined the job. NodeID is chosen by the caller and must
// be unique. Host and NodeRank decide its place in the node order
// (order.go); its name never does.
type NodeJoined struct {
	NodeID string
	Info   NodeInfo
	// Host: this node's agent runs the coordinator, as the caller checked
	// (a secret only that agent holds). At most one node is the host.
	Host bool
	// NodeRank is the node's place as its scheduler numbers the nodes
	// (Slurm's SLURM_NODEID, torchrun's --node-rank); -1: none given.
	NodeRank int
}

// NodeLost: a node went away (its watch stream broke, gossip declared it dead).
type NodeLost struct {
	NodeID string
	Reason string
}

// WorkerExited: an agent reports that one of its workers ended.
type WorkerExited struct {
	NodeID     string
	Generation int64
	Rank       int
	Pid        int
	// ExitCode is the exit status; -1 when a signal ended the process.
	ExitCode int
	// Signal is the name of the signal that ended the process ("SIGKILL"; Go's
	// syscall.Signal.String form, "killed", is understood too), empty if none.
	Signal     string
	StderrTail []string
	// Evidence the agent found about the exit: see [Failure].
	OOMKilled bool
	XIDErrors []string
	Notes     []string
	// Permanent says why the failure can only repeat (the program cannot
	// be executed, a Python import error); "" when it may not. Such a
	// failure ends the job unless its generation made progress.
	Permanent string
	// Repeated: Permanent names a failure an earlier generation already
	// ended with at the same point (the same CUDA out-of-memory at the same
	// step), so it ends the job even when this generation made progress.
	Repeated bool
	// Stopped: the agent ended the process (SIGTERM after the generation
	// ended, SIGKILL after the grace period). A stopped exit never becomes
	// the root cause; an exit by a signal nobody at gotrain sent may
	// (blameKilled).
	Stopped bool
}

// BarrierArrived: rank arrived at barrier Name of Generation. Waiter is the
// caller's id for this waiting call; it comes back in [ReleaseBarrier] or
// [FailBarrier]. Waiter ids must be unique among waiting calls.
type BarrierArrived struct {
	Name       string
	Generation int64
	Rank       int
	Waiter     uint64
}

// BarrierCanceled: the waiting call Waiter gave up (its context ended). Its
// arrival is withdrawn. Unknown waiters are ignored.
type BarrierCanceled struct {
	Waiter uint64
}

// ProgressReported: an agent reports the progress of some of its ranks.
// Entries for other generations than the running one are ignored.
type ProgressReported struct {
	NodeID string
	Ranks  []Progress
}

// Tick: time passed. It carries no data; the time is Step's argument.
type Tick struct{}

func (NodeJoined) isEvent()       {}
func (NodeLost) isEvent()         {}
func (WorkerExited) isEvent()     {}
func (BarrierArrived) isEvent()   {}
func (BarrierCanceled) isEvent()  {}
func (ProgressReported) isEvent() {}
func (Tick) isEvent()             {}

// Progress is one rank's progress as its worker reported it.
type Progress struct {
	Rank             int
	Generation       int64
	Step             int64
	SamplesPerSecond float64
	// Time is when the worker took the sample (the worker's clock).
	Time  time.Time
	Pid   int
	Comms []CommProgress
	// Received is when the machine got the report (Step's now); set by Step.
	Received time.Time
	// ProcState is the process state the agent read from /proc/PID/stat
	// ("R", "S", "D", "T", "Z"), "" when unknown.
	ProcState string
	// Attached: the worker reports through the worker library; false for
	// programs that do not use it (then Comms is empty).
	Attached bool
	// Set by the agent (gpu.go): the rank's GPU sample (GPU.Time zero when
	// none), its step rate, and when it last advanced (zero when unknown).
	GPU            GPUSample
	StepsPerSecond float64
	Advanced       time.Time
	// CommsSource is "nccl-ras" when the agent derived Comms from NCCL's RAS
	// reports (a rank that does not attach; launch counts only),
	// "torch-hook" when from the PyTorch hook's records (a gloo rank), ""
	// when the worker reported them. CommsNote says why an unattached rank has no
	// Comms (NCCL RAS unreachable); "" otherwise.
	CommsSource, CommsNote string
	// StepSource is "torch-hook" when Step is the optimizer steps the
	// PyTorch hook counted for a rank that does not attach; "" otherwise.
	StepSource string
	// CPUPercent is the CPU the rank's process used lately, in percent of
	// one CPU, when CPUKnown (set by the agent).
	CPUPercent float64
	CPUKnown   bool
}

// CommProgress is the progress of one communicator of a rank.
type CommProgress struct {
	Comm         string
	EnteredSeq   int64
	CompletedSeq int64
	LastOp       string
	LastCount    int64
	LastDtype    string
	// Pending is the oldest collective not completed (seq CompletedSeq+1),
	// nil when none.
	Pending *Collective
	// CompletedTime is when CompletedSeq completed (the worker's clock).
	CompletedTime time.Time
	// Error ended collective ErrorSeq (a mismatch, a lost peer, an NCCL
	// async error); empty if none failed.
	Error    string
	ErrorSeq int64
	// Wait is the total time completed collectives spent between entry and
	// completion.
	Wait time.Duration
	// RecentWaits, when the worker sends them, are the times its latest
	// completed collectives RecentFirst, RecentFirst+1, ... took (the
	// straggler check's arrival order).
	RecentFirst int64
	RecentWaits []time.Duration
}

// Action is an output of [Machine.Step] that the caller carries out: one of
// [StartGeneration], [EndGeneration], [FinishJob], [ReleaseBarrier] or
// [FailBarrier].
type Action interface{ isAction() }

// StartGeneration: every node listed must start its ranks.
type StartGeneration struct {
	Generation   int64
	WorldSize    int
	RestartCount int
	MasterAddr   string
	MasterPort   int
	// Nodes in group-rank order; len(Nodes) is the group world size.
	Nodes []NodeAssignment
}

// NodeAssignment is what one node runs in a generation.
type NodeAssignment struct {
	NodeID    string
	GroupRank int
	Ranks     []RankAssignment
}

// RankAssignment places one rank on its node.
type RankAssignment struct {
	Rank      int
	LocalRank int
	// GPU is the GPU index on the node, -1 for none.
	GPU int
	// Survivor: the rank's process of the previous generation is parked and
	// joins this generation in process; its agent does not start a new one.
	Survivor bool
}

// EndGeneration: the generation is over; every agent must stop its workers of
// that generation and report their exits.
type EndGeneration struct {
	Generation int64
	Reason     string
	Failure    *Failure
	// Replace lists the ranks whose processes must not survive into the
	// next generation, even when they recover in process: a persistent
	// straggler being replaced (straggler_replace.go). Their agents stop
	// them, and the next generation starts them afresh (or hands them to a
	// ready standby).
	Replace []int
}

// DropNode: the machine dropped node NodeID from the job (a persistent
// straggler's node under --nnodes MIN:MAX, straggler_replace.go; a node
// that never attached, or attached with no place left, membership.go). The caller
// ends the node's stream with Reason, so that its agent stops its workers
// and exits saying why; the job goes on without it. The machine has
// forgotten the node already, as after NodeLost.
type DropNode struct {
	NodeID   string
	Hostname string
	Reason   string
	// Straggler: dropped as a persistent straggler (a verdict against
	// the machine), not for never attaching.
	Straggler bool
}

// FinishJob: the job is over. No action follows it.
type FinishJob struct {
	Succeeded bool
	// ExitCode is what the launcher should exit with: 0 on success; the root
	// cause's exit code, 128+signal number for a signal, or 1 for a lost node.
	ExitCode int
	Failure  *Failure
	Message  string
}

// ReleaseBarrier: the waiting calls return successfully.
type ReleaseBarrier struct {
	Name       string
	Generation int64
	Waiters    []uint64
}

// FailBarrier: the waiting calls fail with Reason.
type FailBarrier struct {
	Name       string
	Generation int64
	Waiters    []uint64
	Reason     string
}

func (StartGeneration) isAction() {}
func (EndGeneration) isAction()   {}
func (DropNode) isAction()        {}
func (FinishJob) isAction()       {}
func (ReleaseBarrier) isAction()  {}
func (FailBarrier) isAction()     {}

// Failure is the root cause of a generation's end.
type Failure struct {
	Rank       int
	NodeID     string
	Hostname   string
	Pid        int
	ExitCode   int
	Signal     string
	StderrTail []string
	// Reason is set when the whole node went away rather than one worker.
	Reason string
	// OOMKilled: the kernel's OOM killer ended the process.
	OOMKilled bool
	// XIDErrors are GPU error lines of the kernel log seen while it ran.
	XIDErrors []string
	// Notes is other evidence the agent found.
	Notes []string
	// Permanent says why the failure can only repeat, Repeated that it
	// did already ([WorkerExited]).
	Permanent string
	Repeated  bool
}

// State of the job.
type State string

const (
	StateWaiting    State = "waiting"    // waiting for nodes to join
	StateRunning    State = "running"    // a generation is running
	StateRestarting State = "restarting" // a generation ended; waiting for its workers to stop
	StateSucceeded  State = "succeeded"
	StateFailed     State = "failed"
)

// RankState is the state of one rank in the current generation.
type RankState string

const (
	RankRunning RankState = "running"
	RankExited  RankState = "exited"  // exited with code 0
	RankFailed  RankState = "failed"  // exited badly while the generation ran
	RankStopped RankState = "stopped" // exited badly after the generation ended (expected)
	RankLost    RankState = "lost"    // its node went away before it reported
)

// Status is a snapshot of the job.
type Status struct {
	RunID        string
	State        State
	Generation   int64
	WorldSize    int
	RestartCount int
	Nodes        []NodeStatus
	Ranks        []RankStatus
	// Failure is the root cause of the latest generation's end, if any.
	Failure *Failure
	// Verdicts are the hang detector's findings in force (hang_detect.go).
	Verdicts []Verdict
}

// NodeStatus is one node of the job.
type NodeStatus struct {
	NodeID string
	Info   NodeInfo
	// GroupRank is the node's group rank in the current generation, -1 before
	// the first generation.
	GroupRank int
}

// RankStatus is one rank of the current generation.
type RankStatus struct {
	Rank      int
	NodeID    string
	Hostname  string
	LocalRank int
	State     RankState
	ExitCode  int
	Signal    string
	// Progress is the last progress reported, nil if none.
	Progress *Progress
}
