package launcher

import (
	"fmt"
	"sync"
	"time"

	"github.com/gotrain/gotrain/internal/leaderconn"
)

// One leader change of a replicated coordinator is one line per agent:
// where the leader went and how long the change took. While an election
// runs the connection tries the replicas in turn, several times a second,
// each try a switch; the line waits until the new target answers a call,
// so that it neither flips between replicas nor names one that is not the
// leader. How many switches it took and the last one's reason go to the
// log once per change (--verbose).

// failoverNote folds the switches of one leader change into one line.
type failoverNote struct {
	mu       sync.Mutex
	pending  bool
	from     string    // the leader before the change
	start    time.Time // the change's first switch
	switches int       // the connection's switches in this change
	why      string    // the last switch's reason
}

// switched notes a switch away from from at now; it says whether a change
// begins with it (the caller then watches for its end).
func (f *failoverNote) switched(from, why string, now time.Time) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.switches++
	f.why = why
	if f.pending {
		return false
	}
	f.pending, f.from, f.start, f.switches = true, from, now, 1
	return true
}

// summary is the change's switches and last reason, for the log.
func (f *failoverNote) summary() (switches int, why string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.switches, f.why
}

// answered ends the change when leader answered a call after it began: the
// line to print, "" when the leader is where it was (a blip) or the change
// has not ended.
func (f *failoverNote) answered(leader string, at time.Time) (line string, ended bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.pending || !at.After(f.start) {
		return "", false
	}
	f.pending = false
	if leader == f.from {
		return "", true
	}
	return fmt.Sprintf("gotrain: the coordinator's leader moved to %s in %.1f s (was %s)", leader, at.Sub(f.start).Seconds(), f.from), true
}

// giveUp ends a change whose end was not seen (the connection closed, or
// failoverWatch passed).
func (f *failoverNote) giveUp() {
	f.mu.Lock()
	f.pending = false
	f.mu.Unlock()
}

// failoverPoll is how often an agent looks whether the new leader answered;
// failoverWatch how long it looks (the contact loss has its own message).
const (
	failoverPoll  = 100 * time.Millisecond
	failoverWatch = 10 * time.Minute
)

// leaderMoved is lc's note of a switch from one replica to another.
func (a *agent) leaderMoved(lc *leaderconn.Conn, from, to, why string) {
	now := time.Now()
	if !a.failover.switched(from, why, now) || lc == nil {
		return
	}
	deadline := now.Add(failoverWatch)
	var look func()
	look = func() {
		leader := lc.Leader()
		for _, st := range lc.Replicas() {
			if st.Addr != leader || st.Heard != leaderconn.Answers {
				continue
			}
			if line, ended := a.failover.answered(leader, st.At); ended {
				if line != "" {
					fmt.Fprintln(a.cfg.Stderr, line)
				}
				n, why := a.failover.summary()
				a.log.Info("coordinator leader change", "from", from, "to", leader, "switches", n, "last_switch", why)
				return
			}
		}
		if lc.Closed() || time.Now().After(deadline) {
			a.failover.giveUp()
			return
		}
		time.AfterFunc(failoverPoll, look)
	}
	time.AfterFunc(failoverPoll, look)
}
