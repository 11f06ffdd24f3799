package launcher

import (
	"fmt"
	"log/slog"
	"os"

	"github.com/gotrain/gotrain/internal/launcher/agentcore"
	"github.com/gotrain/gotrain/internal/launcher/observe"
	"github.com/gotrain/gotrain/internal/launcher/output"
	"github.com/gotrain/gotrain/internal/launcher/placement"
	"github.com/gotrain/gotrain/internal/launcher/relay"
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
	claims *relay.Claims        // read by the relay's Attach handlers (relay/claims.go)
	hub    *relay.Hub           // progress and telemetry (relay/progress.go)
	place  *placement.Placement // nil without NVML
	log    *slog.Logger
	logDir string // "" for no log files
	// logTrouble warns once when a log file cannot be opened.
	logTrouble *output.Trouble
	oomFile    string // for evidence snapshots (observe/rootcause.go)
}

// get returns process id, nil when the registry has none (its exit was
// stepped, or it never started).
func (r *registry) get(id agentcore.ProcID) *workerProc { return r.procs[id] }

// started records that process id is p, just started as who on GPU gpu
// (-1: none), with ev the node's state taken before it started.
func (r *registry) started(id agentcore.ProcID, p *workerProc, who relay.Proc, gpu int, ev observe.Evidence) {
	r.procs[id] = p
	p.who, p.gpu, p.evidence = who, -1, ev
	r.claims.Set(p.pid(), who)
	r.pin(p, gpu)
	if !who.Standby {
		r.hub.Started(who.Gen, who.Rank, p.pid(), gpu)
	}
}

// became is the step of a process that already runs and is now rank
// who.rank of generation who.gen on GPU gpu: a survivor resumed (its rank
// may change when the job shrank or grew) or a standby handed a rank. The
// claims and the hub know its new identity before it can say hello as it;
// its output is "[rank R]" and goes to rankR.log from now on.
func (r *registry) became(id agentcore.ProcID, who relay.Proc, gpu int) {
	p := r.procs[id]
	if p == nil {
		return
	}
	was := p.who
	p.who = who
	r.claims.Set(p.pid(), who)
	r.hub.Started(who.Gen, who.Rank, p.pid(), gpu)
	r.hub.Rebind(who.Gen, who.Rank, p.pid()) // a survivor's open stream
	r.pin(p, gpu)
	if was.Standby || was.Rank != who.Rank {
		r.route(p, was, who)
	}
	// The root-cause report compares the node's state at the exit with this
	// generation's start, not with an earlier one's.
	p.evidence = observe.SnapshotEvidence(r.oomFile)
}

// route moves p's output to rank who.rank: its prefix and log file.
func (r *registry) route(p *workerProc, was, who relay.Proc) {
	var logFile *os.File
	if r.logDir != "" {
		note := fmt.Sprintf("(standby pid %d)", p.pid())
		if !was.Standby {
			note = fmt.Sprintf("(pid %d, rank %d until generation %d)", p.pid(), was.Rank, was.Gen)
		}
		f, err := openRankLog(r.logDir, who.Rank, who.Gen, note)
		if err != nil {
			r.logTrouble.Warn(err)
		}
		logFile = f
	}
	p.out.Become(who.Rank, who.Local, logFile)
}

// pin binds p to gpu's CPUs, when that is not where it is bound already.
func (r *registry) pin(p *workerProc, gpu int) {
	if gpu == p.gpu {
		return
	}
	r.place.Pin(p.pid(), gpu, r.log)
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
	if !p.who.Standby {
		r.hub.Exited(p.who.Gen, p.who.Rank, p.pid())
	}
	r.claims.Forget(p.pid())
	if p.py != nil {
		_ = p.py.Close() // its reader ends
	}
}
