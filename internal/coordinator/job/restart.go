package job

import (
	"fmt"
	"time"
)

// Restarts: the backoff between generations, and ranks that survive a
// generation change (in-process recovery).
//
// A recoverable worker (one that runs worker.Run) does not have to be stopped
// when its generation ends: its agent tells it the generation ended and
// reports it parked ([WorkerParked]). A parked rank counts as accounted for,
// like a stopped one, and the next generation marks it a survivor
// ([RankAssignment.Survivor]): its agent hands the new generation to the
// running process instead of starting a new one.

// WorkerParked: an agent reports that a rank of an ended generation did not
// exit but waits, in process, for the next generation. It is only valid while
// the generation is ending (between [EndGeneration] and the next
// [StartGeneration]); a rank of an older generation is ignored.
type WorkerParked struct {
	NodeID     string
	Generation int64
	Rank       int
	Pid        int
}

func (WorkerParked) isEvent() {}

// RankParked: the rank's process waits in process for the next generation.
const RankParked RankState = "parked"

// checkParked says why ev is refused; nil when Step takes it.
func (m *Machine) checkParked(ev WorkerParked) error {
	if m.nodes[ev.NodeID] == nil {
		return fmt.Errorf("%w %q reports rank %d parked; only nodes of the job report", ErrUnknownNode, ev.NodeID, ev.Rank)
	}
	if m.gen < 0 || ev.Generation > m.gen {
		return fmt.Errorf("%w: node %q parks rank %d of generation %d, which has not started (current generation: %d)",
			ErrInvalidEvent, ev.NodeID, ev.Rank, ev.Generation, m.gen)
	}
	if ev.Generation < m.gen || m.Finished() {
		return nil // late
	}
	if ev.Rank < 0 || ev.Rank >= len(m.ranks) || m.ranks[ev.Rank].nodeID != ev.NodeID {
		return fmt.Errorf("%w: rank %d does not run on node %q in generation %d", ErrInvalidEvent, ev.Rank, ev.NodeID, ev.Generation)
	}
	if m.state != StateRestarting {
		return fmt.Errorf("%w: node %q parks rank %d, but generation %d is running; ranks park only after the generation ended",
			ErrInvalidEvent, ev.NodeID, ev.Rank, ev.Generation)
	}
	return nil
}

func (m *Machine) parked(ev WorkerParked) ([]Action, error) {
	if err := m.checkParked(ev); err != nil {
		return nil, err
	}
	if ev.Generation < m.gen || m.Finished() {
		return nil, nil // late
	}
	r := &m.ranks[ev.Rank]
	if r.state != RankRunning {
		return nil, nil // exited or parked already
	}
	r.state = RankParked
	return m.afterEnd(), nil
}

// A failure that repeats before any rank made progress (a program that
// fails the same way at start-up) backs off: the restart after the second
// such failure in a row waits RepeatBackoffBase more than RestartBackoff, the
// next twice that, and so on up to RepeatBackoffMax; the job's final message
// says "the same failure N times". Progress is any rank's step or completed
// collective moving in the generation; a generation that made progress
// resets the count.
const (
	RepeatBackoffBase = time.Second
	RepeatBackoffMax  = 30 * time.Second
)

// repeats counts the generations in a row that ended with the same failure
// before any rank made progress.
type repeats struct {
	gen       int64            // the generation moved and firstStep are about
	moved     bool             // a rank's step or completed collective moved in gen
	firstStep map[int]int64    // the first step each rank reported in gen
	count     int              // generations in a row that failed as last, without progress
	last      failureSignature // their failure
	counted   int64            // the last generation counted, + 1 (afterEnd may run again for it)
}

// failureSignature is what makes two failures the same: how the process
// ended, not which rank or pid (at start-up any rank may fail first).
type failureSignature struct {
	exitCode  int
	signal    string
	reason    string
	oomKilled bool
}

// observe notes a progress report of the current generation gen.
func (r *repeats) observe(gen int64, p Progress) {
	if r.gen != gen || r.firstStep == nil {
		r.gen, r.moved, r.firstStep = gen, false, map[int]int64{}
	}
	if first, ok := r.firstStep[p.Rank]; !ok {
		r.firstStep[p.Rank] = p.Step
	} else if p.Step != first {
		r.moved = true
	}
	for _, c := range p.Comms { // communicators are new in every generation
		if c.CompletedSeq > 0 {
			r.moved = true
		}
	}
}

// movedIn says whether a rank's step or completed collective moved in
// generation gen.
func (r *repeats) movedIn(gen int64) bool { return r.gen == gen && r.moved }

// ended counts generation gen's failure f and returns how many generations
// in a row failed that way before any rank made progress (0 when gen made
// progress).
func (r *repeats) ended(gen int64, f *Failure) int {
	if r.counted == gen+1 {
		return r.count
	}
	r.counted = gen + 1
	moved := r.movedIn(gen)
	var sig failureSignature
	if f != nil {
		sig = failureSignature{f.ExitCode, f.Signal, f.Reason, f.OOMKilled}
	}
	switch {
	case moved:
		r.count = 0
	case r.count > 0 && sig == r.last:
		r.count++
	default:
		r.count = 1
	}
	r.last = sig
	return r.count
}

// repeatBackoff is the pause added to RestartBackoff after n failures in a
// row without progress: none after the first, then RepeatBackoffBase,
// doubling, at most RepeatBackoffMax.
func repeatBackoff(n int) time.Duration {
	if n < 2 {
		return 0
	}
	d := RepeatBackoffBase
	for i := 2; i < n && d < RepeatBackoffMax; i++ {
		d *= 2
	}
	return min(d, RepeatBackoffMax)
}

// repeatNote is the words the job's messages add for n failures in a row
// without progress ("" for fewer than two).
func repeatNote(n int) string {
	if n < 2 {
		return ""
	}
	return fmt.Sprintf("; the same failure %d times, each before any rank made progress", n)
}

// restartOrWait starts the next generation now, or, with a restart backoff
// (RestartBackoff, plus repeatBackoff for a failure that repeats before any
// progress), remembers when to start it; the first Tick at or after that
// time does.
func (m *Machine) restartOrWait(repeated int) []Action {
	wait := m.cfg.RestartBackoff + repeatBackoff(repeated)
	if wait <= 0 {
		return []Action{m.start(m.gen+1, m.restarts+1)}
	}
	m.restartAt = m.now.Add(wait)
	m.pendingRestart = true
	return nil
}

// tick starts a restart whose backoff has passed.
func (m *Machine) tick() []Action {
	if !m.pendingRestart || m.Finished() || m.now.Before(m.restartAt) {
		return nil
	}
	return []Action{m.start(m.gen+1, m.restarts+1)}
}

// Deadline returns when the machine next wants a [Tick] to make progress (a
// restart waiting out its backoff, the end of the rendezvous), and false when no tick is due. Callers
// that tick on a coarse interval use it to tick on time.
func (m *Machine) Deadline() (time.Time, bool) {
	switch {
	case m.Finished():
		return time.Time{}, false
	case m.pendingRestart:
		return m.restartAt, true
	case m.state == StateWaiting && m.cfg.RendezvousTimeout > 0 && !m.waitingSince.IsZero():
		return m.waitingSince.Add(m.cfg.RendezvousTimeout), true
	}
	return time.Time{}, false
}

// slot is a local rank of a node: where a process lives across generations.
type slot struct {
	nodeID string
	local  int
}

// survivorsOf returns the slots of the ending generation whose ranks are
// parked.
func (m *Machine) survivorsOf() map[slot]bool {
	s := map[slot]bool{}
	for _, r := range m.ranks {
		if r.state == RankParked {
			s[slot{r.nodeID, r.localRank}] = true
		}
	}
	return s
}
