package launcher

import (
	"context"
	"syscall"

	gotrainv1 "github.com/gotrain/gotrain/proto/gotrain/v1"
)

// In-process recovery, the agent's half (package worker has the other). A
// worker that runs worker.Run says so in its hello (WorkerHello.recoverable).
// When its generation ends and it is still running, the agent does not stop
// it: it sends it GenerationChange{ended} and reports it parked; the
// coordinator counts it as accounted for and marks it a survivor of the next
// generation. Then the agent hands that generation to the running process
// (GenerationChange{started}) instead of starting a new one, so only the
// ranks whose processes are gone start again.

// rehello takes a later hello on an open stream: worker.Run sends one to say
// the worker is recoverable.
func (h *hub) rehello(w *attachedWorker, hello *gotrainv1.WorkerHello) {
	h.mu.Lock()
	defer h.mu.Unlock()
	w.recoverable = hello.GetRecoverable()
}

// recoverableWorker returns the attached stream of rank's process pid in
// generation gen, when that worker recovers in process; nil otherwise.
func (h *hub) recoverableWorker(gen int64, rank, pid int) *attachedWorker {
	w := h.attachedWorker(gen, rank, pid)
	h.mu.Lock()
	defer h.mu.Unlock()
	if w == nil || !w.recoverable {
		return nil
	}
	return w
}

// attachedWorker returns the control stream of process pid as rank in
// generation gen, nil when it has none (it never attached, or is gone).
func (h *hub) attachedWorker(gen int64, rank, pid int) *attachedWorker {
	h.mu.Lock()
	defer h.mu.Unlock()
	s := h.ranks[rank]
	if s == nil || h.gen != gen || s.worker == nil || s.worker.pid != pid {
		return nil
	}
	return s.worker
}

// tellEnded tells worker p, when it is attached, that its generation ended,
// before the agent stops it: package worker then aborts its communicators,
// which releases GPU work waiting for a dead peer (a stream that waits on
// the device does not end with the SIGTERM that follows: without this the
// worker only went at --grace-period's SIGKILL).
func (a *agent) tellEnded(p *workerProc, e *gotrainv1.GenerationEnded) {
	w := a.hub.attachedWorker(e.GetGeneration(), p.spec.rank, p.pid())
	if w == nil {
		return
	}
	select {
	case w.out <- generationChange(&gotrainv1.GenerationChange{Ended: e}):
	default: // its stream is stuck: the signals still come
	}
}

// rebind attaches a surviving worker's stream to its rank in generation gen.
func (h *hub) rebind(gen int64, rank int, w *attachedWorker) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if s := h.ranks[rank]; s != nil && h.gen == gen {
		s.worker = w
		w.gen = gen
	}
}

func generationChange(gc *gotrainv1.GenerationChange) *gotrainv1.AgentMessage {
	return &gotrainv1.AgentMessage{Msg: &gotrainv1.AgentMessage_Generation{Generation: gc}}
}

// park hands the end of generation e to worker p, when it recovers in
// process, and reports it parked. It reports whether it did; if not, the
// caller stops the worker.
func (a *agent) park(p *workerProc, e *gotrainv1.GenerationEnded) bool {
	select {
	case <-p.exited:
		return false
	default:
	}
	w := a.hub.recoverableWorker(e.GetGeneration(), p.spec.rank, p.pid())
	if w == nil {
		return false
	}
	select {
	case w.out <- generationChange(&gotrainv1.GenerationChange{Ended: e}):
	default:
		return false // its stream is stuck: stop it instead
	}
	a.log.Info("worker parked", "rank", p.spec.rank, "pid", p.pid(), "generation", e.GetGeneration())
	req := &gotrainv1.ReportWorkerExitRequest{Generation: e.GetGeneration(), Rank: int32(p.spec.rank), Pid: int32(p.pid()), Parked: true}
	go a.report(context.Background(), req)
	return true
}

// survivors returns, before generation g starts here, the streams of the
// parked workers it marks as survivors, by rank.
func (a *agent) survivors(g *gotrainv1.GenerationStarted) map[int]*attachedWorker {
	out := map[int]*attachedWorker{}
	for _, r := range g.GetRanks() {
		p := a.workers[int(r.GetRank())]
		if !r.GetSurvivor() || p == nil {
			continue
		}
		if w := a.hub.recoverableWorker(p.spec.generation, p.spec.rank, p.pid()); w != nil {
			out[p.spec.rank] = w
		}
	}
	return out
}

// resume hands generation g to rank r's running process when it survives,
// and reports whether it did. A process left over that cannot take it is
// stopped; the caller starts a new one.
func (a *agent) resume(g *gotrainv1.GenerationStarted, r *gotrainv1.RankAssignment, survivors map[int]*attachedWorker) bool {
	rank := int(r.GetRank())
	p := a.workers[rank]
	if p == nil {
		return false
	}
	select {
	case <-p.exited:
		return false
	default:
	}
	w := survivors[rank]
	if w != nil {
		select {
		case w.out <- generationChange(&gotrainv1.GenerationChange{Started: g}):
		default:
			w = nil
		}
	}
	if w == nil {
		go p.stop(syscall.SIGTERM, a.cfg.GracePeriod)
		return false
	}
	p.spec.generation = g.GetGeneration()
	a.hub.started(g.GetGeneration(), rank, p.pid(), int(r.GetGpu()))
	a.hub.rebind(g.GetGeneration(), rank, w)
	a.log.Info("worker resumed in process", "rank", rank, "pid", p.pid(), "generation", g.GetGeneration())
	return true
}
