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

func (m *Machine) parked(ev WorkerParked) ([]Action, error) {
	if m.nodes[ev.NodeID] == nil {
		return nil, fmt.Errorf("%w %q reports rank %d parked; only nodes of the job report", ErrUnknownNode, ev.NodeID, ev.Rank)
	}
	if m.gen < 0 || ev.Generation > m.gen {
		return nil, fmt.Errorf("%w: node %q parks rank %d of generation %d, which has not started (current generation: %d)",
			ErrInvalidEvent, ev.NodeID, ev.Rank, ev.Generation, m.gen)
	}
	if ev.Generation < m.gen || m.Finished() {
		return nil, nil // late
	}
	if ev.Rank < 0 || ev.Rank >= len(m.ranks) || m.ranks[ev.Rank].nodeID != ev.NodeID {
		return nil, fmt.Errorf("%w: rank %d does not run on node %q in generation %d", ErrInvalidEvent, ev.Rank, ev.NodeID, ev.Generation)
	}
	if m.state != StateRestarting {
		return nil, fmt.Errorf("%w: node %q parks rank %d, but generation %d is running; ranks park only after the generation ended",
			ErrInvalidEvent, ev.NodeID, ev.Rank, ev.Generation)
	}
	r := &m.ranks[ev.Rank]
	if r.state != RankRunning {
		return nil, nil // exited or parked already
	}
	r.state = RankParked
	return m.afterEnd(), nil
}

// restartOrWait starts the next generation now, or, with a restart backoff,
// remembers when to start it; the first Tick at or after that time does.
func (m *Machine) restartOrWait() []Action {
	if m.cfg.RestartBackoff <= 0 {
		return []Action{m.start(m.gen+1, m.restarts+1)}
	}
	m.restartAt = m.now.Add(m.cfg.RestartBackoff)
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
