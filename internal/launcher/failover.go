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
// each try a switch; the line waits until the target has stayed put for
// failoverSettle and a call there succeeded since, so that it neither
// flips between replicas nor names one that is not the leader. How many
// switches it took and the last one's reason go to the log once per change
// (--verbose).

// failoverNote folds the switches of one leader change into one line.
type failoverNote struct {
	mu         sync.Mutex
	leader     string    // the leader last announced (or first followed)
	pending    bool      // a change is under way
	start      time.Time // its first switch
	lastSwitch time.Time
	switches   int    // the connection's switches in this change
	why        string // the last switch's reason
}

// follow sets the leader the connection starts with (the replica that
// answered Join), unless one is known.
func (f *failoverNote) follow(leader string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.leader == "" {
		f.leader = leader
	}
}

// switched notes a switch away from from at now; it says whether a change
// begins with it (the caller then watches for its end).
func (f *failoverNote) switched(from, why string, now time.Time) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.leader == "" {
		f.leader = from
	}
	f.lastSwitch, f.why = now, why
	if f.pending {
		f.switches++
		return false
	}
	f.pending, f.start, f.switches = true, now, 1
	return true
}

// failoverSettle is how long the connection must stay with one replica,
// which answered a call with success since, for the change to be over.
const failoverSettle = 500 * time.Millisecond

// settled ends the change when the connection's target has stayed put for
// failoverSettle and a call there succeeded (at ok) after the last switch:
// the line to print ("" when the leader is where it was: a blip), and
// whether the change ended.
func (f *failoverNote) settled(target string, ok, now time.Time) (line string, ended bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.pending || now.Sub(f.lastSwitch) < failoverSettle || !ok.After(f.lastSwitch) {
		return "", false
	}
	f.pending = false
	if target == f.leader {
		return "", true
	}
	line = fmt.Sprintf("gotrain: the coordinator's leader moved to %s in %.1f s (was %s)", target, ok.Sub(f.start).Seconds(), f.leader)
	f.leader = target
	return line, true
}

// summary is the last change's switches and last reason, for the log.
func (f *failoverNote) summary() (switches int, why string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.switches, f.why
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
		target := lc.Leader()
		for _, st := range lc.Replicas() {
			if st.Addr != target {
				continue
			}
			if line, ended := a.failover.settled(target, st.OK, time.Now()); ended {
				if line != "" {
					fmt.Fprintln(a.cfg.Stderr, line)
				}
				n, why := a.failover.summary()
				a.log.Info("coordinator leader change", "from", from, "to", target, "switches", n, "last_switch", why)
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
