package coordinator

import (
	"time"

	"github.com/gotrain/gotrain/internal/coordinator/job"
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
