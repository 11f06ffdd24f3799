package agentcore

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/gotrain/gotrain/internal/jobenv"
)

// ErrInvalidEvent is returned by Step for an event it does not know.
var ErrInvalidEvent = errors.New("agentcore: invalid event")

// Machine is the agent's state. It is not safe for concurrent use: the
// shell calls Step from one goroutine.
type Machine struct {
	cfg  Config
	now  time.Time
	gen  *jobenv.NodeGeneration // the current generation; nil before the first
	next ProcID                 // the last ProcID handed out

	procs map[ProcID]*proc
	// workers: local slot (local rank) → the process that runs it in the
	// latest generation that ran it here. A process keeps its slot across
	// generations; its rank may change when the job shrinks or grows.
	workers map[int]ProcID
	pool    *standbyPool // nil when standbys are off

	stopping  syscall.Signal // SIGINT/SIGTERM that stops the job; 0 if none
	killAllAt time.Time      // when stopping by signal: SIGKILL every worker then
	finishing *Finish        // the result, once the job is over and workers are stopping
	finished  bool
	// refillAt: when the standbys that Python ranks took over are
	// replaced (zero: none waits); see pyRefillDelay.
	refillAt time.Time
	// measureAt: when the node's memory is measured with the first Python
	// standbys under StandbyAuto running (zero: not due); see pyRefillDelay.
	measureAt time.Time
}

// pyRefillDelay is how long after ranks took over Python standbys their
// replacements start: a new standby's `import torch` takes a CPU core for
// a second or more, which the restarted ranks need until their first
// collective (bench/results/torch-restart-standby-2026-12-01-cpu.md). It
// is also how long the first Python standbys under StandbyAuto run before
// the node's memory is measured: the ranks have grown to a size worth
// measuring by then.
const pyRefillDelay = 2 * time.Second

// proc is one process the machine asked for.
type proc struct {
	id       ProcID
	pid      int // 0 until Spawned
	standby  bool
	slot     int // local slot (local rank)
	gpu      int
	rank     int   // -1 for a standby
	gen      int64 // the generation it runs (workers)
	exited   bool
	handover handover // what was last handed to it and may fail
	// attached: its control stream is open; attachedOnce: it said hello as
	// its rank at least once; recoverable: it runs worker.Run.
	attached, attachedOnce, recoverable bool
	// stopping: it was sent SIGTERM to end; killAt is when SIGKILL is due
	// (zero once sent).
	stopping bool
	killAt   time.Time
	// prevGen and prevRank are what it ran before a Resume, restored when
	// the Resume fails: its exit is then the old generation's.
	prevGen  int64
	prevRank int
}

// handover is the last message the machine had the shell deliver to a
// process, to undo when the shell says it failed.
type handover int

const (
	handNone handover = iota
	handPark
	handResume
	handStandby
)

// New returns a machine for cfg.
func New(cfg Config) *Machine {
	m := &Machine{cfg: cfg, procs: map[ProcID]*proc{}, workers: map[int]ProcID{}}
	if on, waitAttach := cfg.standbys(); on {
		m.pool = newStandbyPool(cfg.StandbyTimeout, waitAttach)
		m.pool.python = cfg.Python
		m.pool.memCheck = cfg.Standby == StandbyAuto
	}
	return m
}

// Step takes one event at time now and returns the actions to carry out, in
// order.
func (m *Machine) Step(now time.Time, ev Event) ([]Action, error) {
	m.now = now
	if m.finished {
		return nil, nil
	}
	var out []Action
	switch ev := ev.(type) {
	case GenerationStarted:
		out = m.generationStarted(ev.Gen)
	case GenerationEnded:
		out = m.generationEnded(ev)
	case JobFinished:
		out = m.finish(Finish{Code: ev.exitCode(), Why: FinishedJob})
	case CoordinatorLost:
		if m.stopping != 0 {
			return nil, nil // leaving anyway
		}
		out = m.finish(Finish{Code: 1, Why: FinishedLost})
	case Canceled:
		out = m.finish(Finish{Code: 1, Why: FinishedCancel})
	case Spawned:
		out = m.spawned(ev)
	case SpawnFailed:
		out = m.spawnFailed(ev)
	case Exited:
		out = m.exited(ev)
	case Attached:
		out = m.attached(ev)
	case Detached:
		m.detached(ev)
	case StandbyHello:
		out = m.standbyHello(ev)
	case MemoryMeasured:
		out = m.memoryMeasured(ev)
	case StandbyDetached:
		m.standbyDetached(ev)
	case StandbyUnfit:
		out = m.standbyUnfit(ev)
	case HandoverFailed:
		out = m.handoverFailed(ev.Proc)
	case Signaled:
		out = m.signaled(ev.Sig)
	case Tick:
		out = m.tick()
	default:
		return nil, fmt.Errorf("%w: unknown event type %T", ErrInvalidEvent, ev)
	}
	return append(out, m.maybeFinish()...), nil
}

// exitCode is the agent's exit code for the job's result: 0 on success,
// else the job's code, or 1 when that is not a valid process exit code.
func (ev JobFinished) exitCode() int {
	if ev.Succeeded {
		return 0
	}
	if ev.ExitCode <= 0 || ev.ExitCode > 255 {
		return 1
	}
	return ev.ExitCode
}

// detached marks the workers whose control stream closed as detached;
// standbys' streams are the pool's (StandbyDetached).
func (m *Machine) detached(ev Detached) {
	for _, p := range m.procs {
		if p.pid == ev.Pid && !p.standby {
			p.attached = false
		}
	}
}

func (m *Machine) standbyDetached(ev StandbyDetached) {
	if m.pool != nil {
		m.pool.detached(ev.Slot, ev.Pid, ev.Stream)
	}
}

func (m *Machine) standbyUnfit(ev StandbyUnfit) []Action {
	if m.pool == nil {
		return nil
	}
	return m.killStandbys(m.pool.unfit(ev.Slot, ev.Pid, ev.Reason))
}

// Stopping returns the signal that is stopping the job, 0 if none.
func (m *Machine) Stopping() syscall.Signal { return m.stopping }

// newProc records a process to ask the shell for.
func (m *Machine) newProc(p proc) *proc {
	m.next++
	p.id = m.next
	m.procs[p.id] = &p
	return &p
}

// worker returns the worker process of local slot local, nil when it has
// none.
func (m *Machine) worker(local int) *proc {
	id, ok := m.workers[local]
	if !ok {
		return nil
	}
	return m.procs[id]
}

// slots returns the local slots that have a worker, in order.
func (m *Machine) slots() []int { return slices.Sorted(maps.Keys(m.workers)) }

func (m *Machine) identity(rank int) jobenv.Vars {
	v, _ := jobenv.Identity(*m.gen, rank, m.cfg.Node)
	return v
}

func (m *Machine) generationStarted(g jobenv.NodeGeneration) []Action {
	var out []Action
	if m.gen == nil && m.cfg.Python && m.cfg.Standby != StandbyOff && !m.cfg.NoRestarts {
		switch {
		case m.pool == nil && m.cfg.PythonCold != "":
			out = append(out, Print{Text: "gotrain: warning: no Python standbys (--standby " + string(m.cfg.Standby) + "): " + m.cfg.PythonCold + "; ranks start new interpreters"})
		case m.pool != nil:
			line := "gotrain: starting a Python standby per local rank (a warm interpreter that imported torch; --standby " + string(m.cfg.Standby) + ")"
			if m.pool.memCheck {
				m.pool.startLine = line // once the memory is known to suffice
			} else {
				out = append(out, Print{Text: line})
			}
		}
	}
	m.gen = &g
	handed := false
	for _, r := range g.Ranks {
		acts := m.startRank(r)
		for _, a := range acts {
			_, ok := a.(HandToStandby)
			handed = handed || ok
		}
		out = append(out, acts...)
	}
	// Python standbys wait a little after ranks took some over: the
	// restarted ranks need the CPUs until their first collective. The
	// first ones start with the job, so that a crash in its first seconds
	// finds them warm (under StandbyAuto they go again if the memory
	// measured then turns out short).
	if m.cfg.Python && handed {
		m.refillAt = m.now.Add(pyRefillDelay)
		return out
	}
	return append(out, m.replenishStandbys()...)
}

// startRank gives rank r of the current generation a process: its
// survivor, its slot's standby or a new one.
func (m *Machine) startRank(r jobenv.Assignment) []Action {
	var out []Action
	if p := m.worker(r.LocalRank); p != nil && !p.exited {
		if r.Survivor && p.resumable() {
			p.prevGen, p.prevRank = p.gen, p.rank
			p.gen, p.rank, p.handover = m.gen.Number, r.Rank, handResume
			return []Action{Resume{Proc: p.id, Vars: m.identity(r.Rank)}}
		}
		// Left over and cannot take the generation: stop it.
		out = append(out, m.stop(p)...)
	}
	delete(m.workers, r.LocalRank)
	return append(out, m.newWorker(r)...)
}

// newWorker gives rank r a process that did not run it before: its slot's
// ready standby, or a new one.
func (m *Machine) newWorker(r jobenv.Assignment) []Action {
	var out []Action
	vars := m.identity(r.Rank)
	if m.pool != nil && m.stopping == 0 {
		s, stale := m.pool.take(r.LocalRank, r.GPU)
		if stale != nil {
			out = append(out, Signal{Proc: stale.proc, Sig: syscall.SIGKILL})
		}
		if s != nil {
			if p := m.procs[s.proc]; p != nil && !p.exited {
				p.standby, p.rank, p.gen, p.handover = false, r.Rank, m.gen.Number, handStandby
				m.workers[r.LocalRank] = p.id
				return append(out, HandToStandby{Proc: p.id, Vars: vars, GPUs: m.gen.GPUs()})
			}
		}
	}
	p := m.newProc(proc{rank: r.Rank, slot: r.LocalRank, gen: m.gen.Number, gpu: r.GPU})
	m.workers[r.LocalRank] = p.id
	return append(out, Spawn{Proc: p.id, Vars: vars, GPUs: m.gen.GPUs()})
}

// replenishStandbys asks for a standby for every local slot of the current
// generation that has none; before the first ones under StandbyAuto, for
// the node's memory (Python standbys start at once and the measure follows
// pyRefillDelay later: memoryMeasured may still turn them off).
func (m *Machine) replenishStandbys() []Action {
	sp := m.pool
	if sp == nil || sp.off || m.stopping != 0 || m.finishing != nil || sp.waitAttach || m.gen == nil {
		return nil
	}
	if sp.memCheck && sp.python {
		if m.measureAt.IsZero() && !sp.measuring {
			m.measureAt = m.now.Add(pyRefillDelay)
		}
	} else if sp.memCheck {
		if sp.measuring {
			return nil
		}
		sp.measuring = true
		return []Action{MeasureMemory{Pids: m.rankPids()}}
	}
	var out []Action
	if sp.startLine != "" {
		out = append(out, Print{Text: sp.startLine})
		sp.startLine = ""
	}
	for _, r := range m.gen.Ranks {
		out = append(out, m.startStandby(r.LocalRank, r.GPU)...)
	}
	return out
}

// rankPids returns the pids of the current generation's running workers.
func (m *Machine) rankPids() []int {
	var out []int
	for _, r := range m.gen.Ranks {
		if p := m.worker(r.LocalRank); p != nil && !p.exited && p.pid != 0 {
			out = append(out, p.pid)
		}
	}
	return out
}

// memoryMeasured decides on the first standbys under StandbyAuto: they
// start (or, Python's, stay) when the node has the memory (KeepStandbys);
// else the pool turns off for the job, with one line, and the standbys
// that run are killed. What running standbys hold counts as available:
// the question is whether they fit, and they are in MemAvailable's way.
func (m *Machine) memoryMeasured(ev MemoryMeasured) []Action {
	sp := m.pool
	if sp == nil || !sp.measuring {
		return nil
	}
	sp.measuring, sp.memCheck = false, false
	if ev.Err == "" {
		var held uint64
		for _, r := range ev.StandbyRSS {
			held += r
		}
		if keep, line := KeepStandbys(m.cfg.Standby, ev.Available+held, ev.Total, ev.RSS); !keep {
			if held > 0 {
				line = strings.Replace(line, "(MemAvailable, ", "(MemAvailable with the "+bytesText(held)+" the standbys held, ", 1)
			}
			sp.off, sp.offReason, sp.startLine = true, "the node has too little memory for them (--standby auto)", ""
			return append([]Action{Print{Text: line}}, m.killStandbys(sp.drain(), "")...)
		}
	}
	return m.replenishStandbys()
}

func (m *Machine) startStandby(slot, gpu int) []Action {
	id := m.next + 1
	if !m.pool.reserve(slot, gpu, id) {
		return nil
	}
	p := m.newProc(proc{standby: true, slot: slot, gpu: gpu, rank: -1})
	n := m.cfg.Node
	var node []int
	if m.gen != nil {
		node = m.gen.GPUs()
	}
	return []Action{SpawnStandby{Proc: p.id, Slot: slot, GPU: gpu, GPUs: standbyGPUs(gpu, node),
		Vars: jobenv.StandbyVars{Slot: slot, AgentSocket: n.AgentSocket, JobToken: n.JobToken, RunID: n.RunID, Backend: n.Backend, Host: n.Host, GPU: gpu}}}
}

func (m *Machine) generationEnded(e GenerationEnded) []Action {
	var out []Action
	for _, local := range m.slots() {
		p := m.worker(local)
		if p == nil || p.exited || p.gen != e.Generation {
			continue
		}
		if p.resumable() && !slices.Contains(e.Replace, p.rank) {
			p.handover = handPark
			out = append(out, Park{Proc: p.id, Rank: p.rank, Generation: e.Generation, Reason: e.Reason})
			continue
		}
		if p.attached {
			out = append(out, TellEnded{Proc: p.id, Generation: e.Generation, Reason: e.Reason})
		}
		out = append(out, m.stop(p)...)
	}
	return out
}

// resumable says whether p can be handed the end of its generation and the
// next one instead of being stopped: it runs worker.Run, its control
// stream is open, and nothing is stopping it.
func (p *proc) resumable() bool { return p.attached && p.recoverable && !p.stopping && !p.exited }

// stop asks p to end: SIGTERM now, SIGKILL after the grace period (tick).
// A process being stopped already is left to that.
func (m *Machine) stop(p *proc) []Action {
	if p.exited || p.stopping {
		return nil
	}
	p.stopping, p.killAt = true, m.now.Add(m.cfg.Grace)
	return []Action{Signal{Proc: p.id, Sig: syscall.SIGTERM}}
}

func (m *Machine) spawned(ev Spawned) []Action {
	p := m.procs[ev.Proc]
	if p == nil {
		return nil
	}
	p.pid = ev.Pid
	if p.standby && m.pool != nil && m.pool.started(p.id, ev.Pid, m.now) {
		return []Action{Signal{Proc: p.id, Sig: syscall.SIGKILL}}
	}
	return nil
}

func (m *Machine) spawnFailed(ev SpawnFailed) []Action {
	p := m.procs[ev.Proc]
	if p == nil {
		return nil
	}
	delete(m.procs, p.id)
	if p.standby {
		if m.pool == nil {
			return nil
		}
		return m.killStandbys(m.pool.startFailed(p.id, ev.Err))
	}
	if m.workers[p.slot] == p.id {
		delete(m.workers, p.slot)
	}
	out := []Action{Print{Text: "gotrain: " + ev.Err}}
	if m.stopping == 0 && m.finishing == nil {
		out = append(out, ReportExit{Generation: p.gen, Rank: p.rank, Code: 127, SpawnErr: ev.Err})
	}
	return out
}

// killStandbys kills the standbys the pool let go and prints its warning.
func (m *Machine) killStandbys(kill []ProcID, warn string) []Action {
	var out []Action
	if warn != "" {
		out = append(out, Print{Text: "gotrain: warning: " + warn})
	}
	for _, id := range kill {
		out = append(out, Signal{Proc: id, Sig: syscall.SIGKILL})
	}
	return out
}

func (m *Machine) exited(ev Exited) []Action {
	p := m.procs[ev.Proc]
	if p == nil || p.exited {
		return nil
	}
	p.exited = true
	delete(m.procs, p.id)
	if p.standby {
		return m.standbyExited(p, ev)
	}
	if m.workers[p.slot] == p.id {
		delete(m.workers, p.slot)
	}
	if m.stopping != 0 || m.finishing != nil {
		return nil // the job is being stopped: nothing to decide
	}
	return []Action{ReportExit{Proc: p.id, Generation: p.gen, Rank: p.rank, Code: ev.Code, Signal: ev.Signal, Stopped: p.endedByUs(ev)}}
}

// endedByUs says whether p's exit is this machine's doing: it was being
// stopped, and did not die of a SIGKILL the machine had not sent yet (one
// from someone else, or the OOM killer, while it handled the SIGTERM).
func (p *proc) endedByUs(ev Exited) bool {
	return p.stopping && !(ev.Signal == syscall.SIGKILL && !p.killAt.IsZero())
}

func (m *Machine) standbyExited(p *proc, ev Exited) []Action {
	if m.pool == nil {
		return nil
	}
	how := fmt.Sprintf("exit status %d", ev.Code)
	if ev.Signal != 0 {
		how = "killed by " + SignalName(ev.Signal)
	}
	res := m.pool.exited(p.id, how)
	if !res.known {
		return nil // the pool let it go and killed it
	}
	out := m.killStandbys(res.kill, res.warn)
	if res.replace && m.stopping == 0 && m.finishing == nil {
		out = append(out, m.startStandby(res.slot, res.gpu)...)
	}
	return out
}

func (m *Machine) attached(ev Attached) []Action {
	for _, p := range m.procs {
		if p.pid != ev.Pid || p.standby {
			continue
		}
		p.attached, p.recoverable = true, ev.Recoverable
		if ev.Generation == p.gen && ev.Rank == p.rank {
			p.attachedOnce = true
		}
	}
	return m.startStandbysOnceAttached()
}

// startStandbysOnceAttached (StandbyAuto): once every worker of the current
// generation on this node has attached, the program is known to use package
// worker, and the standbys start.
func (m *Machine) startStandbysOnceAttached() []Action {
	if m.pool == nil || !m.pool.waitAttach || m.gen == nil {
		return nil
	}
	for _, r := range m.gen.Ranks {
		p := m.worker(r.LocalRank)
		if p == nil || p.gen != m.gen.Number || !p.attachedOnce {
			return nil
		}
	}
	m.pool.waitAttach = false
	m.pool.startLine = "gotrain: every worker attached with package worker: starting hot standbys (--standby auto)"
	return m.replenishStandbys()
}

func (m *Machine) standbyHello(ev StandbyHello) []Action {
	if m.pool == nil {
		return []Action{RejectStandby{Slot: ev.Slot, Pid: ev.Pid, Reason: "this agent keeps no standbys (gotrain launch --standby)"}}
	}
	if err := m.pool.hello(ev.Slot, ev.Pid, ev.Stream); err != nil {
		return []Action{RejectStandby{Slot: ev.Slot, Pid: ev.Pid, Reason: err.Error()}}
	}
	return []Action{AcceptStandby{Slot: ev.Slot, Pid: ev.Pid}}
}

// handoverFailed undoes a Park, Resume or HandToStandby that did not reach
// its process: a worker that cannot be parked or resumed is stopped, a
// standby that cannot take its rank is killed, and the rank gets a new
// process.
func (m *Machine) handoverFailed(id ProcID) []Action {
	p := m.procs[id]
	if p == nil || p.exited {
		return nil
	}
	h := p.handover
	p.handover = handNone
	switch h {
	case handPark:
		return m.stop(p)
	case handResume, handStandby:
		if m.workers[p.slot] == p.id {
			delete(m.workers, p.slot)
		}
		local := p.slot
		var out []Action
		if h == handResume {
			p.gen, p.rank = p.prevGen, p.prevRank // its exit is the old generation's
			out = m.stop(p)
		} else {
			// Still a standby, one the pool let go: its exit is nobody's.
			p.standby, p.rank = true, -1
			out = []Action{Signal{Proc: p.id, Sig: syscall.SIGKILL}}
		}
		if m.gen == nil || m.stopping != 0 || m.finishing != nil {
			return out
		}
		if rank, ok := m.gen.RankAt(local); ok {
			r, _ := m.gen.Assignment(rank)
			p := m.newProc(proc{rank: r.Rank, slot: r.LocalRank, gen: m.gen.Number, gpu: r.GPU})
			m.workers[r.LocalRank] = p.id
			out = append(out, Spawn{Proc: p.id, Vars: m.identity(r.Rank), GPUs: m.gen.GPUs()})
		}
		return out
	}
	return nil
}

// signaled: SIGINT and SIGTERM stop the job (the workers get it, then
// SIGKILL after the grace period; a second one kills at once); any other
// signal is passed on to the workers.
func (m *Machine) signaled(sig syscall.Signal) []Action {
	switch sig {
	case syscall.SIGINT, syscall.SIGTERM:
		if m.stopping != 0 {
			return m.signalAll(syscall.SIGKILL)
		}
		m.stopping = sig
		m.killAllAt = m.now.Add(m.cfg.Grace)
		stops := m.signalAll(sig)
		if len(stops) == 0 {
			return nil // no worker to wait for: the agent says why it stopped as it ends
		}
		out := []Action{Print{Text: fmt.Sprintf("gotrain: %s received: stopping %d worker(s) (SIGKILL in %s; press Ctrl-C again to kill now)",
			SignalName(sig), len(stops), m.cfg.Grace)}}
		return append(out, stops...)
	}
	return m.signalAll(sig)
}

// signalAll sends sig to every worker.
func (m *Machine) signalAll(sig syscall.Signal) []Action {
	var out []Action
	for _, local := range m.slots() {
		if p := m.worker(local); p != nil && !p.exited {
			out = append(out, Signal{Proc: p.id, Sig: sig})
		}
	}
	return out
}

func (m *Machine) tick() []Action {
	var out []Action
	if !m.killAllAt.IsZero() && !m.now.Before(m.killAllAt) {
		m.killAllAt = time.Time{}
		out = append(out, m.signalAll(syscall.SIGKILL)...)
	}
	for _, id := range slices.Sorted(maps.Keys(m.procs)) {
		p := m.procs[id]
		if !p.killAt.IsZero() && !m.now.Before(p.killAt) {
			p.killAt = time.Time{}
			out = append(out, Signal{Proc: p.id, Sig: syscall.SIGKILL})
		}
	}
	if m.pool != nil {
		out = append(out, m.killStandbys(m.pool.tick(m.now))...)
	}
	if !m.refillAt.IsZero() && !m.now.Before(m.refillAt) {
		m.refillAt = time.Time{}
		out = append(out, m.replenishStandbys()...)
	}
	if !m.measureAt.IsZero() && !m.now.Before(m.measureAt) {
		m.measureAt = time.Time{}
		if sp := m.pool; sp != nil && sp.memCheck && !sp.off && !sp.closed && m.gen != nil && m.stopping == 0 && m.finishing == nil {
			sp.measuring = true
			out = append(out, MeasureMemory{Pids: m.rankPids(), Standbys: sp.pids()})
		}
	}
	return out
}

// finish ends the job with f once every worker has exited: the workers
// still running are stopped first.
func (m *Machine) finish(f Finish) []Action {
	if m.finishing != nil {
		return nil
	}
	m.finishing = &f
	var out []Action
	for _, id := range slices.Sorted(maps.Keys(m.procs)) {
		if p := m.procs[id]; !p.standby {
			out = append(out, m.stop(p)...)
		}
	}
	return out
}

// running reports whether a process that is no standby still runs: a
// worker, or one of an older generation that is being stopped.
func (m *Machine) running() bool {
	for _, p := range m.procs {
		if !p.standby {
			return true
		}
	}
	return false
}

// maybeFinish emits Finish once the job is over and no worker is left:
// standbys are killed, and the agent is done.
func (m *Machine) maybeFinish() []Action {
	var f Finish
	switch {
	case m.finished:
		return nil
	case m.finishing != nil && !m.running():
		f = *m.finishing
	case m.stopping != 0 && !m.running():
		f = Finish{Code: 128 + int(m.stopping), Why: FinishedSignal}
	default:
		return nil
	}
	m.finished = true
	var out []Action
	if m.pool != nil {
		out = m.killStandbys(m.pool.close(), "")
	}
	return append(out, f)
}
