package launcher

import (
	"fmt"
	"log/slog"
	"os"

	"github.com/gotrain/gotrain/launcher/agentcore"
	"github.com/gotrain/gotrain/launcher/observe"
)

// registry is the agent's one table of the processes the machine asked for:
// process id ↔ process (and so pid) ↔ what it is now (its identity: a rank
// of a generation, or a slot's standby). Every way a process comes to be
// something (spawned, a survivor resumed under a new rank, a standby handed
// a rank) and its exit go through one lifecycle step here, which updates
// every concern that must know: the claims the relay checks hellos against,
// the progress hub (and its telemetry), the output route ("[rank R]" and
// rankR.log), CPU pinning and the root-cause evidence. No table is written
// anywhere else, so none can drift from another.
//
// Only the loop's goroutine calls it (actions.go, launcher.go's feed).
type registry struct {
	procs  map[agentcore.ProcID]*workerProc
	claims *claims    // read by the relay's Attach handlers (claims.go)
	hub    *hub       // progress and telemetry (progress.go)
	place  *placement // nil without NVML
	log    *slog.Logger
	logDir string // "" for no log files
	// logTrouble warns once when a log file cannot be opened.
	logTrouble *logTrouble
	oomFile    string // for evidence snapshots (observe/rootcause.go)
}

// get returns process id, nil when the registry has none (its exit was
// stepped, or it never started).
func (r *registry) get(id agentcore.ProcID) *workerProc { return r.procs[id] }

// started records that process id is p, just started as who on GPU gpu
// (-1: none), with ev the node's state taken before it started.
func (r *registry) started(id agentcore.ProcID, p *workerProc, who startedProc, gpu int, ev observe.Evidence) {
	r.procs[id] = p
	p.who, p.gpu, p.evidence = who, -1, ev
	r.claims.set(p.pid(), who)
	r.pin(p, gpu)
	if !who.standby {
		r.hub.started(who.gen, who.rank, p.pid(), gpu)
	}
}

// became is the step of a process that already runs and is now rank
// who.rank of generation who.gen on GPU gpu: a survivor resumed (its rank
// may change when the job shrank or grew) or a standby handed a rank. The
// claims and the hub know its new identity before it can say hello as it;
// its output is "[rank R]" and goes to rankR.log from now on.
func (r *registry) became(id agentcore.ProcID, who startedProc, gpu int) {
	p := r.procs[id]
	if p == nil {
		return
	}
	was := p.who
	p.who = who
	r.claims.set(p.pid(), who)
	r.hub.started(who.gen, who.rank, p.pid(), gpu)
	r.hub.rebind(who.gen, who.rank, r.hub.workerByPid(p.pid())) // a survivor's open stream
	r.pin(p, gpu)
	if was.standby || was.rank != who.rank {
		r.route(p, was, who)
	}
	// The root-cause report compares the node's state at the exit with this
	// generation's start, not with an earlier one's.
	p.evidence = observe.SnapshotEvidence(r.oomFile)
}

// route moves p's output to rank who.rank: its prefix and log file.
func (r *registry) route(p *workerProc, was, who startedProc) {
	var logFile *os.File
	if r.logDir != "" {
		note := fmt.Sprintf("(standby pid %d)", p.pid())
		if !was.standby {
			note = fmt.Sprintf("(pid %d, rank %d until generation %d)", p.pid(), was.rank, was.gen)
		}
		f, err := openRankLog(r.logDir, who.rank, who.gen, note)
		if err != nil {
			r.logTrouble.warn(err)
		}
		logFile = f
	}
	p.out.become(who.rank, who.local, logFile)
}

// pin binds p to gpu's CPUs, when that is not where it is bound already.
func (r *registry) pin(p *workerProc, gpu int) {
	if gpu == p.gpu {
		return
	}
	r.place.pin(p.pid(), gpu, r.log)
	p.gpu = gpu
}

// exited is the step of process id whose exit the machine took: it is no
// rank's and no slot's any more, and the registry forgets it.
func (r *registry) exited(id agentcore.ProcID) {
	p := r.procs[id]
	if p == nil {
		return
	}
	delete(r.procs, id)
	if !p.who.standby {
		r.hub.exited(p.who.gen, p.who.rank, p.pid())
	}
	r.claims.forget(p.pid())
	if p.py != nil {
		_ = p.py.conn.Close() // its reader ends
	}
}
