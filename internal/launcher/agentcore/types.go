package agentcore

import (
	"fmt"
	"strings"
	"syscall"
	"time"

	"github.com/gotrain/gotrain/internal/jobenv"
)

// ProcID names a process the machine asked the shell to start.
type ProcID int

// StandbyMode says when the agent keeps hot standbys.
type StandbyMode string

const (
	// StandbyOff: never ("" is the same).
	StandbyOff StandbyMode = "off"
	// StandbyOn: from the first generation on (any backend).
	StandbyOn StandbyMode = "on"
	// StandbyAuto: on the NCCL backend, once every worker of the current
	// generation on this node has attached with package worker: the
	// program then supports standbys. Programs that do not use package
	// worker never attach, so never get a spare — except Python programs
	// (Config.Python), whose standbys are warm interpreters: those start
	// with the ranks, on any backend, and go again when the node's memory,
	// measured 2 s in, turns out short.
	StandbyAuto StandbyMode = "auto"
)

// Enabled says whether the agent keeps a standby pool at all on backend.
func (m StandbyMode) Enabled(backend string) bool {
	return m == StandbyOn || (m == StandbyAuto && backend == "nccl")
}

// Config is the node's part of the job.
type Config struct {
	// Node is what every worker of the node is told (jobenv.Identity).
	Node jobenv.Node
	// Grace is how long a worker gets between SIGTERM and SIGKILL.
	Grace time.Duration
	// Standby and StandbyTimeout: see StandbyMode; a standby that has not
	// said hello after StandbyTimeout turns standbys off.
	Standby        StandbyMode
	StandbyTimeout time.Duration
	// Python: the program is a Python interpreter running a script or a
	// module, and its standbys are warm interpreters (the shell's
	// bootstrap: torch imported, CUDA initialised) that say they are ready
	// on a pipe of their own instead of attaching with package worker.
	// Under StandbyAuto they start with the first generation, on any
	// backend.
	Python bool
	// PythonCold, when not empty, says why the Python program cannot be
	// pre-warmed (an interpreter option the bootstrap cannot reproduce):
	// the machine warns once, at the first generation, and keeps no
	// standbys.
	PythonCold string
	// NoRestarts: no rank of the job will ever need a new process
	// (--max-restarts 0 and a fixed node count), so Python standbys, which
	// would only hold memory and compete with the workers' start, are not
	// started, and nothing is said about them.
	NoRestarts bool
}

// standbys reports whether the machine keeps a standby pool, and whether
// the pool waits for every worker to attach before it starts any.
func (c Config) standbys() (on, waitAttach bool) {
	if c.Python && (c.Standby == StandbyAuto || c.Standby == StandbyOn) {
		return c.PythonCold == "" && !c.NoRestarts, false
	}
	return c.Standby.Enabled(c.Node.Backend), c.Standby == StandbyAuto
}

// Event is an input to [Machine.Step].
type Event interface{ isEvent() }

// GenerationStarted: the coordinator started a generation; Gen holds this
// node's ranks.
type GenerationStarted struct{ Gen jobenv.NodeGeneration }

// GenerationEnded: the coordinator ended a generation. The processes of
// the ranks in Replace (a persistent straggler, --on-straggler replace) are
// stopped even when they recover in process, so that the next generation
// starts them afresh or hands them to a standby.
type GenerationEnded struct {
	Generation int64
	Reason     string
	Replace    []int
}

// JobFinished: the coordinator says the job is over.
type JobFinished struct {
	Succeeded bool
	ExitCode  int
}

// CoordinatorLost: the coordinator's stream broke.
type CoordinatorLost struct{ Err string }

// Canceled: the agent was told to stop (its context ended).
type Canceled struct{}

// Spawned: the shell started process Proc (a Spawn or SpawnStandby).
type Spawned struct {
	Proc ProcID
	Pid  int
}

// SpawnFailed: the shell could not start process Proc.
type SpawnFailed struct {
	Proc ProcID
	Err  string
}

// Exited: process Proc ended (or is known to be ending: its exit is final).
type Exited struct {
	Proc ProcID
	// Code is the exit status, -1 when a signal ended it.
	Code   int
	Signal syscall.Signal
}

// Attached: the worker with process id Pid said hello on its control
// stream as Rank of Generation; Recoverable when it runs worker.Run
// (in-process recovery). A second hello on the same stream updates
// Recoverable.
type Attached struct {
	Pid         int
	Rank        int
	Generation  int64
	Recoverable bool
}

// Detached: the worker Pid's control stream ended.
type Detached struct{ Pid int }

// StandbyHello: a standby said hello for Slot on Stream (a number the shell
// gives each stream, never 0). The machine answers with AcceptStandby or
// RejectStandby.
type StandbyHello struct {
	Slot, Pid int
	Stream    uint64
}

// StandbyDetached: standby Pid's Stream for Slot ended.
type StandbyDetached struct {
	Slot, Pid int
	Stream    uint64
}

// StandbyUnfit: standby Pid of Slot says it cannot serve (a Python
// standby could not import torch or a --standby-preload module): Reason
// says why. Standbys turn off with one warning.
type StandbyUnfit struct {
	Slot, Pid int
	Reason    string
}

// HandoverFailed: a Park, Resume or HandToStandby could not reach process
// Proc (its stream is gone or stuck, or it is exiting).
type HandoverFailed struct{ Proc ProcID }

// Signaled: the agent received a signal.
type Signaled struct{ Sig syscall.Signal }

// Tick: time passed (Step's now).
type Tick struct{}

func (GenerationStarted) isEvent() {}
func (GenerationEnded) isEvent()   {}
func (JobFinished) isEvent()       {}
func (CoordinatorLost) isEvent()   {}
func (Canceled) isEvent()          {}
func (Spawned) isEvent()           {}
func (SpawnFailed) isEvent()       {}
func (Exited) isEvent()            {}
func (Attached) isEvent()          {}
func (Detached) isEvent()          {}
func (StandbyHello) isEvent()      {}
func (StandbyDetached) isEvent()   {}
func (StandbyUnfit) isEvent()      {}
func (HandoverFailed) isEvent()    {}
func (Signaled) isEvent()          {}
func (Tick) isEvent()              {}

// Action is an output of [Machine.Step], for the shell to carry out in order.
type Action interface {
	isAction()
	fmt.Stringer
}

// Spawn: start process Proc as a rank's worker with identity Vars, seeing
// GPUs (the node's GPUs of the job in local-rank order; nil for CPU ranks).
// The shell answers with Spawned or SpawnFailed.
type Spawn struct {
	Proc ProcID
	Vars jobenv.Vars
	GPUs []int
}

// SpawnStandby: start process Proc as the standby of local slot Slot on
// GPU (-1 for none), seeing GPUs. The shell answers with Spawned or
// SpawnFailed.
type SpawnStandby struct {
	Proc      ProcID
	Slot, GPU int
	Vars      jobenv.StandbyVars
	GPUs      []int
}

// Signal: send Sig to process Proc's group (nothing when it is gone).
type Signal struct {
	Proc ProcID
	Sig  syscall.Signal
}

// TellEnded: tell worker Proc, over its control stream when it has one,
// that its generation ended, before it is stopped (package worker then
// aborts its communicators). Best effort: nothing comes back.
type TellEnded struct {
	Proc       ProcID
	Generation int64
	Reason     string
}

// Park: hand the end of Generation to worker Proc, which recovers in
// process, and once delivered report it parked to the coordinator. When it
// cannot be delivered the shell answers HandoverFailed.
type Park struct {
	Proc       ProcID
	Rank       int
	Generation int64
	Reason     string
}

// Resume: hand generation Vars.Generation to worker Proc, a survivor that
// keeps its rank. HandoverFailed when it cannot be delivered.
type Resume struct {
	Proc ProcID
	Vars jobenv.Vars
}

// HandToStandby: give standby Proc the rank of Vars, seeing GPUs (as
// Spawn's); from now on it is that rank's worker. HandoverFailed when it
// cannot be delivered.
type HandToStandby struct {
	Proc ProcID
	Vars jobenv.Vars
	GPUs []int
}

// ReportExit: tell the coordinator that Rank's process of Generation ended
// (Code -1 and Signal when a signal ended it). Proc is 0 for a process that
// never started (SpawnErr says why).
type ReportExit struct {
	Proc       ProcID
	Generation int64
	Rank       int
	Code       int
	Signal     syscall.Signal
	SpawnErr   string
	// Stopped: this machine ended the process (its SIGTERM, or its SIGKILL
	// after the grace period), so the exit follows another cause.
	Stopped bool
}

// AcceptStandby and RejectStandby answer a StandbyHello.
type AcceptStandby struct{ Slot, Pid int }

type RejectStandby struct {
	Slot, Pid int
	Reason    string
}

// Print: a line for the person running the job (stderr).
type Print struct{ Text string }

// Finish: the agent is done; every worker has exited. Code is what
// `gotrain launch` exits with; Why says what ended it.
type Finish struct {
	Code int
	Why  FinishReason
}

// FinishReason says what ended the agent.
type FinishReason string

const (
	FinishedJob    FinishReason = "job"         // the coordinator finished the job
	FinishedSignal FinishReason = "signal"      // SIGINT or SIGTERM stopped it
	FinishedLost   FinishReason = "coordinator" // the coordinator was lost
	FinishedCancel FinishReason = "canceled"    // the agent's context ended
)

func (Spawn) isAction()         {}
func (SpawnStandby) isAction()  {}
func (Signal) isAction()        {}
func (TellEnded) isAction()     {}
func (Park) isAction()          {}
func (Resume) isAction()        {}
func (HandToStandby) isAction() {}
func (ReportExit) isAction()    {}
func (AcceptStandby) isAction() {}
func (RejectStandby) isAction() {}
func (Print) isAction()         {}
func (Finish) isAction()        {}

func (a Spawn) String() string {
	return fmt.Sprintf("spawn p%d rank=%d gen=%d local=%d/%d gpu=%d restarts=%d gpus=%v", a.Proc, a.Vars.Rank, a.Vars.Generation,
		a.Vars.LocalRank, a.Vars.LocalWorldSize, a.Vars.GPU, a.Vars.RestartCount, a.GPUs)
}
func (a SpawnStandby) String() string {
	return fmt.Sprintf("spawn-standby p%d slot=%d gpu=%d gpus=%v", a.Proc, a.Slot, a.GPU, a.GPUs)
}
func (a Signal) String() string { return fmt.Sprintf("signal p%d %s", a.Proc, SignalName(a.Sig)) }
func (a TellEnded) String() string {
	return fmt.Sprintf("tell-ended p%d gen=%d", a.Proc, a.Generation)
}
func (a Park) String() string {
	return fmt.Sprintf("park p%d rank=%d gen=%d", a.Proc, a.Rank, a.Generation)
}
func (a Resume) String() string {
	return fmt.Sprintf("resume p%d rank=%d gen=%d restarts=%d", a.Proc, a.Vars.Rank, a.Vars.Generation, a.Vars.RestartCount)
}
func (a HandToStandby) String() string {
	return fmt.Sprintf("hand-to-standby p%d rank=%d gen=%d", a.Proc, a.Vars.Rank, a.Vars.Generation)
}
func (a ReportExit) String() string {
	s := fmt.Sprintf("report-exit rank=%d gen=%d", a.Rank, a.Generation)
	switch {
	case a.SpawnErr != "":
		s += fmt.Sprintf(" code=%d spawn-error=%q", a.Code, a.SpawnErr)
	case a.Signal != 0:
		s += fmt.Sprintf(" p%d signal=%s", a.Proc, SignalName(a.Signal))
	default:
		s += fmt.Sprintf(" p%d code=%d", a.Proc, a.Code)
	}
	if a.Stopped {
		s += " stopped"
	}
	return s
}
func (a AcceptStandby) String() string {
	return fmt.Sprintf("accept-standby slot=%d pid=%d", a.Slot, a.Pid)
}
func (a RejectStandby) String() string {
	return fmt.Sprintf("reject-standby slot=%d pid=%d: %s", a.Slot, a.Pid, a.Reason)
}
func (a Print) String() string  { return "print " + strings.TrimSpace(a.Text) }
func (a Finish) String() string { return fmt.Sprintf("finish code=%d why=%s", a.Code, a.Why) }

// SignalName is the signal's name as a person writes it ("SIGTERM").
func SignalName(s syscall.Signal) string {
	switch s {
	case syscall.SIGINT:
		return "SIGINT"
	case syscall.SIGTERM:
		return "SIGTERM"
	case syscall.SIGKILL:
		return "SIGKILL"
	case syscall.SIGHUP:
		return "SIGHUP"
	case syscall.SIGUSR1:
		return "SIGUSR1"
	case syscall.SIGUSR2:
		return "SIGUSR2"
	case syscall.SIGSEGV:
		return "SIGSEGV"
	case syscall.SIGABRT:
		return "SIGABRT"
	}
	return fmt.Sprintf("signal %d", int(s))
}
