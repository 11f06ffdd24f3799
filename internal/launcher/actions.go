package launcher

import (
	"fmt"
	"os"
	"slices"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gotrain/gotrain/internal/jobenv"
	"github.com/gotrain/gotrain/internal/launcher/agentcore"
	"github.com/gotrain/gotrain/internal/launcher/explain"
	"github.com/gotrain/gotrain/internal/launcher/observe"
	"github.com/gotrain/gotrain/internal/launcher/pystandby"
	"github.com/gotrain/gotrain/internal/launcher/relay"
	"github.com/gotrain/gotrain/internal/launcher/workerenv"
	"github.com/gotrain/gotrain/internal/procstat"
	gotrainv1 "github.com/gotrain/gotrain/proto/gotrain/v1"
)

// do carries out one of the machine's actions and returns the events it
// caused, for the machine to take next. Only the loop's goroutine calls it.
func (a *agent) do(act agentcore.Action) []agentcore.Event {
	switch act := act.(type) {
	case agentcore.Spawn:
		return a.spawn(act)
	case agentcore.SpawnStandby:
		return a.spawnStandby(act)
	case agentcore.Signal:
		if p := a.reg.get(act.Proc); p != nil {
			if p.who.Standby && act.Sig == unix.SIGKILL {
				a.log.Info("standby stopped", "slot", p.who.Slot, "pid", p.pid())
			}
			p.signal(act.Sig)
		}
	case agentcore.TellEnded:
		// Best effort: a worker whose stream is stuck still gets the signals.
		a.sendTo(act.Proc, generationChange(&gotrainv1.GenerationChange{Ended: a.ended(act.Generation, act.Reason)}))
	case agentcore.Park:
		return a.park(act)
	case agentcore.Resume:
		return a.resume(act)
	case agentcore.HandToStandby:
		return a.handToStandby(act)
	case agentcore.ReportExit:
		a.reportExit(act)
	case agentcore.AcceptStandby:
		a.log.Info("standby ready", "slot", act.Slot, "pid", act.Pid)
		a.links.Verdict(act.Pid, nil)
	case agentcore.RejectStandby:
		a.links.Verdict(act.Pid, fmt.Errorf("%s", act.Reason))
		for _, p := range a.reg.procs {
			if p.py != nil && p.pid() == act.Pid {
				_ = p.py.Close() // the bootstrap exits at EOF
			}
		}
	case agentcore.Print:
		a.stderr.WriteLine("", []byte(act.Text))
	case agentcore.MeasureMemory:
		ev := measureMemory(act.Pids, act.Standbys)
		if ev.Err != "" {
			a.log.Warn("cannot read the node's memory; keeping standbys", "err", ev.Err)
		} else {
			a.log.Info("memory for standbys", "available", ev.Available, "total", ev.Total, "ranks_rss", ev.RSS, "standbys_rss", ev.StandbyRSS)
		}
		return []agentcore.Event{ev}
	}
	return nil
}

// spawn starts a rank's worker.
func (a *agent) spawn(act agentcore.Spawn) []agentcore.Event {
	v := act.Vars
	spec := workerSpec{rank: v.Rank, local: v.LocalRank, generation: v.Generation, program: a.cfg.Program, args: workerenv.SubstituteLocalRank(a.cfg.Args, v.LocalRank),
		env: a.workerEnv(v.Environ(), act.GPUs), logDir: a.cfg.LogDir, logTrouble: a.logTrouble,
		output: a.cfg.Output, stdin: a.workerStdin(), argv0: a.argv0}
	ev := observe.SnapshotEvidence(a.oomFile)
	p, err := startWorker(a.sup, spec, a.stdout, a.stderr)
	if err != nil {
		return []agentcore.Event{agentcore.SpawnFailed{Proc: act.Proc, Err: err.Error()}}
	}
	a.adopt(act.Proc, p, relay.Proc{Rank: v.Rank, Local: v.LocalRank, Gen: v.Generation}, v.GPU, ev)
	a.recov.rankStarted(time.Now(), v.Generation, v.Rank, p.pid(), false) // recoveries.go
	return []agentcore.Event{agentcore.Spawned{Proc: act.Proc, Pid: p.pid()}}
}

// spawnStandby starts a hot standby (relay/standby.go).
func (a *agent) spawnStandby(act agentcore.SpawnStandby) []agentcore.Event {
	if a.py != nil {
		return a.spawnPythonStandby(act)
	}
	// A Go standby's argv is fixed before it knows its rank; torchrun's
	// ${local_rank} in it is still right, since a slot's standby is only
	// ever handed the rank of that local rank (agentcore: newWorker takes
	// the pool's standby of r.LocalRank).
	spec := workerSpec{rank: -1, standby: true, slot: act.Slot, program: a.cfg.Program, args: workerenv.SubstituteLocalRank(a.cfg.Args, act.Slot),
		env: a.workerEnv(act.Vars.Environ(), act.GPUs), logDir: a.cfg.LogDir, logTrouble: a.logTrouble,
		output: a.cfg.Output, stdin: a.workerStdin(), argv0: a.argv0}
	p, err := startWorker(a.sup, spec, a.stdout, a.stderr)
	if err != nil {
		return []agentcore.Event{agentcore.SpawnFailed{Proc: act.Proc, Err: err.Error()}}
	}
	a.log.Info("standby started", "slot", act.Slot, "gpu", act.GPU, "pid", p.pid())
	a.adopt(act.Proc, p, relay.Proc{Standby: true, Slot: act.Slot, Local: act.Slot}, act.GPU, observe.Evidence{})
	return []agentcore.Event{agentcore.Spawned{Proc: act.Proc, Pid: p.pid()}}
}

// spawnPythonStandby starts a Python standby for act's slot
// (internal/launcher/pystandby).
func (a *agent) spawnPythonStandby(act agentcore.SpawnStandby) []agentcore.Event {
	link, theirs, err := pystandby.SocketPair()
	if err != nil {
		return []agentcore.Event{agentcore.SpawnFailed{Proc: act.Proc, Err: fmt.Sprintf("socket pair for a Python standby: %v", err)}}
	}
	device := -1
	if act.GPU >= 0 {
		device = slices.Index(act.GPUs, act.GPU)
	}
	// The interpreter's options are given before the rank is known: the
	// slot is the local rank it will run (see spawnStandby).
	args := a.py.Command(device, a.cfg.StandbyPreload, act.Slot)
	spec := workerSpec{rank: -1, standby: true, slot: act.Slot, program: a.cfg.Program, args: args,
		env: a.workerEnv(act.Vars.Environ(), act.GPUs), logDir: a.cfg.LogDir, logTrouble: a.logTrouble, extra: []*os.File{theirs},
		output: a.cfg.Output, stdin: a.workerStdin(), argv0: a.argv0}
	p, err := startWorker(a.sup, spec, a.stdout, a.stderr)
	_ = theirs.Close()
	if err != nil {
		_ = link.Close()
		return []agentcore.Event{agentcore.SpawnFailed{Proc: act.Proc, Err: err.Error()}}
	}
	p.py = link
	link.OnPreloaded = a.preloaded // preload.go
	a.log.Info("python standby started", "slot", act.Slot, "gpu", act.GPU, "pid", p.pid())
	a.adopt(act.Proc, p, relay.Proc{Standby: true, Slot: act.Slot, Local: act.Slot}, act.GPU, observe.Evidence{})
	stream := a.links.Next()
	a.waits.Add(1)
	go func() {
		defer a.waits.Done()
		link.Read(a.log, a.post, act.Slot, p.pid(), stream)
	}()
	return []agentcore.Event{agentcore.Spawned{Proc: act.Proc, Pid: p.pid()}}
}

// workerStdin is the workers' and standbys' stdin: gotrain's own when the
// job can only ever have one rank (one worker, one node: torchrun's
// behaviour, so that breakpoint() and input() work in a debug run), else
// nil (/dev/null: many ranks must not race for one terminal).
func (a *agent) workerStdin() *os.File {
	if a.cfg.Stdin == nil || a.cfg.NprocPerNode != 1 || a.cfg.Nodes != 1 || a.cfg.Coordinator != "" {
		return nil
	}
	return a.cfg.Stdin
}

// adopt makes p, just started as who, the machine's process id
// (registry.go): its exit reaches the loop, and the agent does not return
// before it is reaped.
func (a *agent) adopt(id agentcore.ProcID, p *workerProc, who relay.Proc, gpu int, ev observe.Evidence) {
	a.reg.started(id, p, who, gpu, ev)
	a.waits.Add(2)
	go func() { defer a.waits.Done(); <-p.done() }()
	go func() {
		defer a.waits.Done()
		<-p.exited()
		e := p.exit()
		a.post(agentcore.Exited{Proc: id, Code: e.Code, Signal: e.Signal})
	}()
}

// exiting reports whether process id's exit is known already (it is on its
// way to the loop), or the process is unknown.
func (a *agent) exiting(id agentcore.ProcID) bool {
	p := a.reg.get(id)
	if p == nil {
		return true
	}
	select {
	case <-p.exited():
		return true
	default:
		return false
	}
}

// sendTo sends m on worker id's control stream without waiting; it reports
// whether it did (false when it has none, or it is full).
func (a *agent) sendTo(id agentcore.ProcID, m *gotrainv1.AgentMessage) bool {
	p := a.reg.get(id)
	if p == nil {
		return false
	}
	return a.hub.Send(p.pid(), m)
}

// ended is the GenerationEnded message for a generation.
func (a *agent) ended(gen int64, reason string) *gotrainv1.GenerationEnded {
	return &gotrainv1.GenerationEnded{Generation: gen, Reason: reason}
}

// park hands the end of its generation to a worker that recovers in process
// and reports it parked (relay/recover.go has the protocol).
func (a *agent) park(act agentcore.Park) []agentcore.Event {
	failed := []agentcore.Event{agentcore.HandoverFailed{Proc: act.Proc}}
	if a.exiting(act.Proc) || !a.sendTo(act.Proc, generationChange(&gotrainv1.GenerationChange{Ended: a.ended(act.Generation, act.Reason)})) {
		return failed
	}
	p := a.reg.get(act.Proc)
	a.log.Info("worker parked", "rank", act.Rank, "pid", p.pid(), "generation", act.Generation)
	a.queueReport(&gotrainv1.ReportWorkerExitRequest{Generation: act.Generation, Rank: int32(act.Rank), Pid: int32(p.pid()), Parked: true})
	return nil
}

// resume hands the current generation to a parked survivor.
func (a *agent) resume(act agentcore.Resume) []agentcore.Event {
	failed := []agentcore.Event{agentcore.HandoverFailed{Proc: act.Proc}}
	if a.exiting(act.Proc) || !a.sendTo(act.Proc, generationChange(&gotrainv1.GenerationChange{Started: a.gen})) {
		return failed
	}
	p, v := a.reg.get(act.Proc), act.Vars
	was := p.who.Rank
	a.reg.became(act.Proc, relay.Proc{Rank: v.Rank, Local: v.LocalRank, Gen: v.Generation}, v.GPU)
	a.log.Info("worker resumed in process", "rank", v.Rank, "was_rank", was, "pid", p.pid(), "generation", v.Generation)
	return nil
}

// handToStandby gives a ready standby its rank; from then on the process is
// that rank's worker: its output is "[rank R]", its log file rankR.log.
func (a *agent) handToStandby(act agentcore.HandToStandby) []agentcore.Event {
	failed := []agentcore.Event{agentcore.HandoverFailed{Proc: act.Proc}}
	p, v := a.reg.get(act.Proc), act.Vars
	if a.exiting(act.Proc) {
		return failed
	}
	slot := p.who.Slot
	// The hub and the claims know the rank's new pid, and its output is the
	// rank's, before the process can attach or print as it (a Python
	// standby runs the program as soon as it reads the assignment).
	a.reg.became(act.Proc, relay.Proc{Rank: v.Rank, Local: v.LocalRank, Gen: v.Generation}, v.GPU)
	if p.py != nil {
		err := p.py.Hand(a.py, a.workerEnv(v.Environ(), act.GPUs), v.LocalRank) // pystandby/pystandby.go
		p.py = nil
		if err != nil {
			a.log.Warn("cannot hand the rank to the Python standby; stopping it", "slot", slot, "pid", p.pid(), "err", err)
			return failed
		}
	} else {
		msg := &gotrainv1.AgentMessage{Msg: &gotrainv1.AgentMessage_Assign{Assign: &gotrainv1.StandbyAssignment{Generation: a.gen, Rank: int32(v.Rank)}}}
		if !a.links.Send(p.pid(), msg) {
			a.log.Warn("standby's stream is gone or full; stopping it", "slot", slot, "pid", p.pid())
			return failed
		}
	}
	a.log.Info("worker started from standby", "rank", v.Rank, "slot", slot, "pid", p.pid(), "generation", v.Generation)
	a.recov.rankStarted(time.Now(), v.Generation, v.Rank, p.pid(), true) // recoveries.go
	return nil
}

// reportExit tells the coordinator how a rank's process ended, with what
// the agent knows of why (observe/rootcause.go).
func (a *agent) reportExit(act agentcore.ReportExit) {
	req := &gotrainv1.ReportWorkerExitRequest{Generation: act.Generation, Rank: int32(act.Rank), Stopped: act.Stopped}
	p := a.reg.get(act.Proc)
	if act.SpawnErr != "" || p == nil {
		req.ExitCode, req.StderrTail = int32(act.Code), []string{act.SpawnErr}
		if !a.cfg.RetryPermanent {
			req.Permanent = explain.PermanentCause(act.SpawnErr, nil) // explain/permanent.go
		}
		a.queueReport(req)
		return
	}
	e := p.exit()
	if !act.Stopped && (e.Code != 0 || e.Signal != 0) {
		a.recov.failure(time.Now()) // recoveries.go
	}
	req.Pid, req.ExitCode, req.StderrTail = int32(p.pid()), int32(e.Code), p.stderr.Snapshot()
	if e.Signal != 0 {
		req.Signal = unix.SignalName(e.Signal)
		req.ExitCode = -1
	}
	if e.Code != 0 || e.Signal != 0 {
		// early: seen when its output closed while exiting, before wait4
		a.log.Info("worker exited", "rank", act.Rank, "pid", p.pid(), "exit", e.String(), "early", e.Early)
		observe.ExamineExit(req, p.evidence, p.pid(), e.Signal)
		errFile := jobenv.Vars{AgentSocket: a.socket, Generation: act.Generation, Rank: act.Rank}.ErrorFile()
		if note, ok := observe.ErrorFileNote(errFile); ok {
			req.Notes = append(req.Notes, note)
		}
		if !a.cfg.RetryPermanent && e.Signal == 0 {
			req.Permanent = explain.PermanentCause("", req.StderrTail) // explain/permanent.go
		}
		if e.Signal == 0 {
			a.examineCUDAOOM(req, p) // cudaoom.go
		}
	}
	a.queueReport(req)
}

// measureMemory answers the machine's MeasureMemory (asked for the first
// standbys under --standby auto) from /proc: a rank or standby whose RSS
// cannot be read (it is exiting) counts 0.
func measureMemory(pids, standbys []int) agentcore.MemoryMeasured {
	avail, total, err := procstat.MemInfo()
	if err != nil {
		return agentcore.MemoryMeasured{Err: err.Error()}
	}
	rss := func(pids []int) []uint64 {
		out := make([]uint64, len(pids))
		for i, pid := range pids {
			out[i], _ = procstat.RSS(pid)
		}
		return out
	}
	return agentcore.MemoryMeasured{Available: avail, Total: total, RSS: rss(pids), StandbyRSS: rss(standbys)}
}

func generationChange(gc *gotrainv1.GenerationChange) *gotrainv1.AgentMessage {
	return &gotrainv1.AgentMessage{Msg: &gotrainv1.AgentMessage_Generation{Generation: gc}}
}
