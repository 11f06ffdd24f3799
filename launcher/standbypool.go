package launcher

import (
	"fmt"
	"maps"
	"slices"
	"time"

	gotrainv1 "github.com/gotrain/gotrain/proto/gotrain/v1"
)

// standbyPool is the bookkeeping of hot standbys (gotrain launch --standby):
// at most one spare process of the worker program per local slot (local
// rank), bound to that slot's GPU. It is pure: the agent (standby.go) starts
// and kills the processes, serialises the calls and passes the time in.
//
// A standby's life: reserve (the slot is being filled) → started (the
// process runs) → hello (it said hello{standby} on Agent.Attach: ready) →
// take (handed a rank: no longer the pool's). It leaves the pool without
// being taken when it exits, when the pool turns off, or at close.
//
// The pool turns off, for good, when the program shows that it does not
// support standbys (a standby exited, or was still silent after
// helloTimeout, without ever saying hello) or when standbys keep dying
// (maxStandbyDeaths in a row that said hello and were never used). Ranks then
// get new processes as without --standby.
type standbyPool struct {
	helloTimeout time.Duration
	slots        map[int]*standby
	off          bool // turned off; see offReason
	offReason    string
	closed       bool // the job ends: nothing new starts
	deaths       int  // standbys that said hello and died unused, in a row
}

// maxStandbyDeaths is how many standbys may die unused in a row before the
// pool turns off rather than restarting them forever.
const maxStandbyDeaths = 3

// standby is one spare process.
type standby struct {
	slot, gpu int
	proc      *workerProc // nil while it is being started
	spawned   time.Time
	helloed   bool                           // it said hello once
	send      chan<- *gotrainv1.AgentMessage // its open stream; nil when none
}

func newStandbyPool(helloTimeout time.Duration) *standbyPool {
	return &standbyPool{helloTimeout: helloTimeout, slots: map[int]*standby{}}
}

// ready reports whether s can take a rank now.
func (s *standby) ready() bool { return s.proc != nil && s.send != nil }

// reserve claims slot for a new standby on gpu. It returns the reservation
// when the caller should start one; nil when the slot has one (starting or
// running) or the pool is off or closed.
func (sp *standbyPool) reserve(slot, gpu int) *standby {
	if sp.off || sp.closed || sp.slots[slot] != nil {
		return nil
	}
	s := &standby{slot: slot, gpu: gpu}
	sp.slots[slot] = s
	return s
}

// started records the process started for reservation s. It reports
// whether the caller must kill it at once: the reservation was dropped
// meanwhile (the pool turned off or closed, or the slot changed GPU).
func (sp *standbyPool) started(s *standby, p *workerProc, now time.Time) (kill bool) {
	if sp.slots[s.slot] != s {
		return true
	}
	s.proc, s.spawned = p, now
	return false
}

// startFailed gives up reservation s, whose process could not be started,
// and turns the pool off: it returns the other standbys to kill and the
// warning to print.
func (sp *standbyPool) startFailed(s *standby, err error) (kill []*workerProc, warn string) {
	if sp.slots[s.slot] == s {
		delete(sp.slots, s.slot)
	}
	return sp.turnOff(fmt.Sprintf("a standby could not be started: %v", err))
}

// hello makes slot's standby, process pid, ready: send reaches its stream.
func (sp *standbyPool) hello(slot, pid int, send chan<- *gotrainv1.AgentMessage) error {
	s := sp.slots[slot]
	if s == nil || s.proc == nil || s.proc.pid() != pid {
		if sp.off {
			return fmt.Errorf("standbys are off: %s", sp.offReason)
		}
		return fmt.Errorf("no standby of slot %d has pid %d", slot, pid)
	}
	s.helloed, s.send = true, send
	return nil
}

// detached records that the stream send of slot's standby pid ended.
func (sp *standbyPool) detached(slot, pid int, send chan<- *gotrainv1.AgentMessage) {
	if s := sp.slots[slot]; s != nil && s.proc != nil && s.proc.pid() == pid && s.send == send {
		s.send = nil
	}
}

// take hands slot's standby over to a rank on gpu: the caller sends it the
// assignment on s.send, and the process is a worker from then on. It returns
// nil when the slot has no ready standby. stale, when not nil, is a standby
// of the slot bound to another GPU: the caller kills it.
func (sp *standbyPool) take(slot, gpu int) (s, stale *standby) {
	s = sp.slots[slot]
	switch {
	case s == nil:
		return nil, nil
	case s.gpu != gpu:
		delete(sp.slots, slot)
		return nil, s
	case !s.ready():
		return nil, nil
	}
	delete(sp.slots, slot)
	sp.deaths = 0
	return s, nil
}

// standbyExit is what the pool makes of a standby's exit.
type standbyExit struct {
	known     bool // it was in the pool (not killed by it)
	slot, gpu int
	replace   bool   // start another for its slot
	warn      string // the pool turned off: tell the user, once
}

// exited records that standby process p ended before it was taken.
func (sp *standbyPool) exited(p *workerProc) standbyExit {
	var s *standby
	for _, c := range sp.slots {
		if c.proc == p {
			s = c
		}
	}
	if s == nil {
		return standbyExit{}
	}
	delete(sp.slots, s.slot)
	out := standbyExit{known: true, slot: s.slot, gpu: s.gpu}
	switch {
	case !s.helloed:
		_, out.warn = sp.turnOff(fmt.Sprintf("the standby for slot %d (pid %d) exited (%s) without saying hello: the program does not use gotrain's worker library (worker.Init)", s.slot, p.pid(), p.exit))
	case sp.deaths+1 >= maxStandbyDeaths:
		_, out.warn = sp.turnOff(fmt.Sprintf("%d standbys in a row exited unused (the last: slot %d, pid %d, %s)", maxStandbyDeaths, s.slot, p.pid(), p.exit))
	default:
		sp.deaths++
		out.replace = !sp.closed
	}
	return out
}

// tick turns the pool off when a standby has been running helloTimeout
// without saying hello. It returns the processes to kill and, when it
// turned off, the warning.
func (sp *standbyPool) tick(now time.Time) (kill []*workerProc, warn string) {
	if sp.off || sp.closed {
		return nil, ""
	}
	for _, slot := range slices.Sorted(maps.Keys(sp.slots)) {
		s := sp.slots[slot]
		if s.proc != nil && !s.helloed && now.Sub(s.spawned) >= sp.helloTimeout {
			return sp.turnOff(fmt.Sprintf("the standby for slot %d (pid %d) did not say hello within %s: the program does not use gotrain's worker library (worker.Init), or starts slower than --standby-timeout", s.slot, s.proc.pid(), sp.helloTimeout))
		}
	}
	return nil, ""
}

// turnOff turns the pool off for reason, returning every standby to kill
// and the warning (empty when it was off already).
func (sp *standbyPool) turnOff(reason string) (kill []*workerProc, warn string) {
	kill = sp.drain()
	if sp.off {
		return kill, ""
	}
	sp.off, sp.offReason = true, reason
	return kill, "--standby is off: " + reason + "; ranks start new processes as without --standby"
}

// close ends the pool with the job: it returns every standby to kill.
func (sp *standbyPool) close() []*workerProc {
	sp.closed = true
	return sp.drain()
}

func (sp *standbyPool) drain() []*workerProc {
	var out []*workerProc
	for _, slot := range slices.Sorted(maps.Keys(sp.slots)) {
		if p := sp.slots[slot].proc; p != nil {
			out = append(out, p)
		}
	}
	clear(sp.slots)
	return out
}
