package coordinator

import (
	"time"

	"github.com/gotrain/gotrain/coordinator/job"
	gotrainv1 "github.com/gotrain/gotrain/proto/gotrain/v1"
)

// tickOnDeadline arms a timer for the machine's deadline d (a restart
// waiting out its backoff: state.ArmDeadline), so that the restart starts
// on time rather than on the next coarse tick. s.mu is held.
func (s *Server) tickOnDeadline(d time.Time) {
	if s.deadlineArmed && s.deadline.Equal(d) {
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
	if _, err := s.commit(&gotrainv1.LogEntry{Entry: &gotrainv1.LogEntry_WorkerExit{WorkerExit: req}}); err != nil {
		return nil, err
	}
	return &gotrainv1.ReportWorkerExitResponse{}, nil
}
