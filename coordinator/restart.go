package coordinator

import (
	"time"

	"github.com/gotrain/gotrain/coordinator/job"
	gotrainv1 "github.com/gotrain/gotrain/proto/gotrain/v1"
)

// tickOnDeadline arms a timer for the machine's next deadline (a restart
// waiting out its backoff), so that the restart starts on time rather than on
// the next coarse tick. s.mu is held.
func (s *Server) tickOnDeadline() {
	d, ok := s.m.Deadline()
	if !ok || (s.deadlineArmed && s.deadline.Equal(d)) {
		return
	}
	s.deadlineArmed, s.deadline = true, d
	s.bg.after(max(d.Sub(s.now()), 0), func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.deadline.Equal(d) {
			s.deadlineArmed = false
		}
		if s.stop.Err() != nil {
			return
		}
		if err := s.step(job.Tick{}); err != nil {
			s.log.Error("tick", "err", err)
		}
	})
}

// reportParked records that a recoverable worker waits in process for the
// next generation.
func (s *Server) reportParked(req *gotrainv1.ReportWorkerExitRequest) (*gotrainv1.ReportWorkerExitResponse, error) {
	s.log.Debug("worker parked", "node_id", req.GetNodeId(), "generation", req.GetGeneration(), "rank", req.GetRank(), "pid", req.GetPid())
	if _, err := s.commit(entry{Event: job.WorkerParked{NodeID: req.GetNodeId(), Generation: req.GetGeneration(), Rank: int(req.GetRank()), Pid: int(req.GetPid())}}); err != nil {
		return nil, err
	}
	return &gotrainv1.ReportWorkerExitResponse{}, nil
}

// restartPlan is what a restart's announcement needs: the generation that
// ended (nil once announced), its world size, and the restart count of the
// generation that runs.
type restartPlan struct {
	ended    *job.EndGeneration
	world    int
	restarts int
}

// announceRestart tells every node that the next generation, restart
// number restarts, starts after wait, when it follows the ended generation
// the plan holds (not a generation that grows an elastic job, nor one
// already announced). s.mu is held.
func (s *Server) announceRestart(restarts int, wait time.Duration) {
	e := s.plan.ended
	if e == nil || restarts <= s.plan.restarts {
		return
	}
	s.plan.ended = nil
	maxRestarts := s.m.Config().MaxRestarts
	ev := &gotrainv1.GenerationEvent{Event: &gotrainv1.GenerationEvent_Restarting{Restarting: &gotrainv1.RestartPlanned{
		Generation:  e.Generation,
		WorldSize:   int32(s.plan.world),
		Failure:     failureToProto(e.Failure),
		Attempt:     int32(restarts + 1),
		MaxAttempts: int32(maxRestarts + 1),
		WaitMs:      wait.Milliseconds(),
	}}}
	s.log.Info("restarting", "generation", e.Generation+1, "restart_count", restarts, "max_restarts", maxRestarts, "in", wait, "reason", e.Reason)
	for _, o := range s.outboxes {
		o.push(ev)
	}
}

// announceWait announces a restart that waits out its backoff, once the
// machine has decided on it (every rank of the ended generation stopped).
// s.mu is held.
func (s *Server) announceWait(now time.Time) {
	if s.plan.ended == nil || s.m.Status().State != job.StateRestarting {
		return
	}
	if d, ok := s.m.Deadline(); ok {
		s.announceRestart(s.plan.restarts+1, max(d.Sub(now), 0))
	}
}
