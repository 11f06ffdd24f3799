package agentcore

import (
	"fmt"
	"maps"
	"slices"
	"time"
)

// standbyPool is the bookkeeping of hot standbys: at most one spare process
// of the worker program per local slot (local rank), bound to that slot's
// GPU.
//
// A standby's life: reserve (the slot is being filled) → started (the
// process runs) → hello (it said hello{standby}: ready) → take (handed a
// rank: no longer the pool's). It leaves the pool without being taken when
// it exits, when the pool turns off, or at close.
//
// The pool turns off, for good, when the program shows that it does not
// support standbys (a standby exited, or was still silent after
// helloTimeout, without ever saying hello) or when standbys keep dying
// (maxStandbyDeaths in a row that said hello and were never used). Ranks then
// get new processes as without standbys.
type standbyPool struct {
	helloTimeout time.Duration
	slots        map[int]*standby
	off          bool // turned off; see offReason
	offReason    string
	closed       bool // the job ends: nothing new starts
	deaths       int  // standbys that said hello and died unused, in a row
	// waitAttach (StandbyAuto): no standby starts until every worker of a
	// generation has attached.
	waitAttach bool
	// python: the standbys are warm Python interpreters (Config.Python),
	// which say "ready" rather than hello; only the warnings differ.
	python bool
	// memCheck (StandbyAuto): the first standbys wait for the node's memory
	// to be measured (MeasureMemory, once the ranks run); measuring: that
	// measure is asked for. startLine is printed when they do start.
	memCheck, measuring bool
	startLine           string
}

// maxStandbyDeaths is how many standbys may die unused in a row before the
// pool turns off rather than restarting them forever.
const maxStandbyDeaths = 3

// standby is one spare process.
type standby struct {
	slot, gpu int
	proc      ProcID
	pid       int // 0 until it started
	spawned   time.Time
	helloed   bool   // it said hello once
	stream    uint64 // its open stream (the shell numbers them); 0: none
}

func newStandbyPool(helloTimeout time.Duration, waitAttach bool) *standbyPool {
	return &standbyPool{helloTimeout: helloTimeout, slots: map[int]*standby{}, waitAttach: waitAttach}
}

// ready reports whether s can take a rank now.
func (s *standby) ready() bool { return s.pid != 0 && s.stream != 0 }

// reserve claims slot for a new standby process proc on gpu. It reports
// false when the slot has one (starting or running) or the pool is off or
// closed.
func (sp *standbyPool) reserve(slot, gpu int, proc ProcID) bool {
	if sp.off || sp.closed || sp.slots[slot] != nil {
		return false
	}
	sp.slots[slot] = &standby{slot: slot, gpu: gpu, proc: proc}
	return true
}

// find returns the standby of process proc, nil when the pool has none.
func (sp *standbyPool) find(proc ProcID) *standby {
	for _, s := range sp.slots {
		if s.proc == proc {
			return s
		}
	}
	return nil
}

// started records that proc runs as pid. It reports whether the caller must
// kill it at once: the reservation was dropped meanwhile.
func (sp *standbyPool) started(proc ProcID, pid int, now time.Time) (kill bool) {
	s := sp.find(proc)
	if s == nil {
		return true
	}
	s.pid, s.spawned = pid, now
	return false
}

// startFailed gives up proc, whose process could not be started, and turns
// the pool off: it returns the other standbys to kill and the warning.
func (sp *standbyPool) startFailed(proc ProcID, err string) (kill []ProcID, warn string) {
	if s := sp.find(proc); s != nil {
		delete(sp.slots, s.slot)
	}
	return sp.turnOff(fmt.Sprintf("a standby could not be started: %s", err))
}

// hello makes slot's standby, process pid, ready on stream.
func (sp *standbyPool) hello(slot, pid int, stream uint64) error {
	s := sp.slots[slot]
	if s == nil || s.pid == 0 || s.pid != pid {
		if sp.off {
			return fmt.Errorf("standbys are off: %s", sp.offReason)
		}
		return fmt.Errorf("no standby of slot %d has pid %d", slot, pid)
	}
	s.helloed, s.stream = true, stream
	return nil
}

// detached records that stream of slot's standby pid ended (a stream
// replaced since does not count).
func (sp *standbyPool) detached(slot, pid int, stream uint64) {
	if s := sp.slots[slot]; s != nil && s.pid == pid && s.stream == stream {
		s.stream = 0
	}
}

// take hands slot's standby over to a rank on gpu. It returns nil when the
// slot has no ready standby. stale, when not nil, is a standby of the slot
// bound to another GPU: the caller kills it.
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
	known     bool // it was in the pool (not let go by it)
	slot, gpu int
	replace   bool     // start another for its slot
	kill      []ProcID // the pool turned off: the other standbys to kill
	warn      string   // and the warning for the user, once
}

// exited records that standby process proc ended before it was taken;
// how says how.
func (sp *standbyPool) exited(proc ProcID, how string) standbyExit {
	s := sp.find(proc)
	if s == nil {
		return standbyExit{}
	}
	delete(sp.slots, s.slot)
	out := standbyExit{known: true, slot: s.slot, gpu: s.gpu}
	switch {
	case !s.helloed && sp.python:
		out.kill, out.warn = sp.turnOff(fmt.Sprintf("the Python standby for slot %d (pid %d) exited (%s) before it was ready (its output is under [standby %d])", s.slot, s.pid, how, s.slot))
	case !s.helloed:
		out.kill, out.warn = sp.turnOff(fmt.Sprintf("the standby for slot %d (pid %d) exited (%s) without saying hello: the program does not use gotrain's worker library (worker.Init)", s.slot, s.pid, how))
	case sp.deaths+1 >= maxStandbyDeaths:
		out.kill, out.warn = sp.turnOff(fmt.Sprintf("%d standbys in a row exited unused (the last: slot %d, pid %d, %s)", maxStandbyDeaths, s.slot, s.pid, how))
	default:
		sp.deaths++
		out.replace = !sp.closed
	}
	return out
}

// tick turns the pool off when a standby has been running helloTimeout
// without saying hello. It returns the processes to kill and, when it
// turned off, the warning. Python standbys have no such timeout: their
// bootstrap is gotrain's own, so silence says nothing about the program,
// only that importing takes long (a loaded machine, a slow file system, a
// large --standby-preload); a standby not ready yet is simply not used.
func (sp *standbyPool) tick(now time.Time) (kill []ProcID, warn string) {
	if sp.off || sp.closed || sp.python {
		return nil, ""
	}
	for _, slot := range slices.Sorted(maps.Keys(sp.slots)) {
		s := sp.slots[slot]
		if s.pid != 0 && !s.helloed && now.Sub(s.spawned) >= sp.helloTimeout {
			return sp.turnOff(fmt.Sprintf("the standby for slot %d (pid %d) did not say hello within %s: the program does not use gotrain's worker library (worker.Init), or starts slower than --standby-timeout", s.slot, s.pid, sp.helloTimeout))
		}
	}
	return nil, ""
}

// unfit turns the pool off because slot's standby pid says it cannot
// serve (why); a standby the pool no longer has is ignored (the pool
// turned off already, or let it go).
func (sp *standbyPool) unfit(slot, pid int, why string) (kill []ProcID, warn string) {
	s := sp.slots[slot]
	if s == nil || s.pid != pid {
		return nil, ""
	}
	what := "the standby"
	if sp.python {
		what = "the Python standby"
	}
	return sp.turnOff(fmt.Sprintf("%s for slot %d (pid %d) cannot be warmed: %s", what, slot, pid, why))
}

// turnOff turns the pool off for reason, returning every standby to kill
// and the warning (empty when it was off already).
func (sp *standbyPool) turnOff(reason string) (kill []ProcID, warn string) {
	kill = sp.drain()
	if sp.off {
		return kill, ""
	}
	sp.off, sp.offReason = true, reason
	return kill, "--standby is off: " + reason + "; ranks start new processes as without --standby"
}

// close ends the pool with the job: it returns every standby to kill.
func (sp *standbyPool) close() []ProcID {
	sp.closed = true
	return sp.drain()
}

// pids returns the pids of the standbys that run, by slot.
func (sp *standbyPool) pids() []int {
	var out []int
	for _, slot := range slices.Sorted(maps.Keys(sp.slots)) {
		if s := sp.slots[slot]; s.pid != 0 {
			out = append(out, s.pid)
		}
	}
	return out
}

// drain empties the pool, returning the standbys that were started (one
// still starting is killed when it says it started).
func (sp *standbyPool) drain() []ProcID {
	var out []ProcID
	for _, slot := range slices.Sorted(maps.Keys(sp.slots)) {
		if s := sp.slots[slot]; s.pid != 0 {
			out = append(out, s.proc)
		}
	}
	clear(sp.slots)
	return out
}

// MeasureMemory: read the node's MemAvailable and MemTotal, the RSS of
// processes Pids (the ranks running here) and of Standbys (the standbys
// running already: Python's start with the job), and answer
// MemoryMeasured.
type MeasureMemory struct{ Pids, Standbys []int }

// MemoryMeasured answers MeasureMemory, in bytes: RSS and StandbyRSS have
// one entry per pid (0 for one that could not be read). Err says why the
// node's memory could not be read; standbys are then kept, as the check
// cannot judge.
type MemoryMeasured struct {
	Available, Total uint64
	RSS, StandbyRSS  []uint64
	Err              string
}

func (MeasureMemory) isAction() {}
func (MemoryMeasured) isEvent() {}

func (a MeasureMemory) String() string {
	if len(a.Standbys) > 0 {
		return fmt.Sprintf("measure-memory pids=%v standbys=%v", a.Pids, a.Standbys)
	}
	return fmt.Sprintf("measure-memory pids=%v", a.Pids)
}

// standbyReserve is what must stay available once the standbys run: 10% of
// MemTotal, at least 1 GiB. The ranks are measured young and grow (data,
// optimizer state), and when memory runs out the OOM killer picks the
// largest process, a rank rather than a standby: the reserve is for that
// growth, proportional to the node as the workloads it runs are.
func standbyReserve(total uint64) uint64 { return max(total/10, 1<<30) }

// KeepStandbys decides whether mode keeps standbys on a node with avail
// bytes available (MemAvailable) of total, whose ranks hold rss each. A
// standby holds about what its rank holds, so under StandbyAuto they are
// kept only when the ranks' RSS once more fits in avail and leaves
// standbyReserve; StandbyOn keeps them whatever the memory. When auto does
// not keep them, line is the one line that says why and how to force them.
// avail or total 0 means not known: kept.
func KeepStandbys(mode StandbyMode, avail, total uint64, rss []uint64) (keep bool, line string) {
	switch {
	case mode == StandbyOn:
		return true, ""
	case mode != StandbyAuto:
		return false, ""
	case avail == 0 || total == 0:
		return true, ""
	}
	var need uint64
	for _, r := range rss {
		need += r
	}
	reserve := standbyReserve(total)
	if need+reserve <= avail {
		return true, ""
	}
	return false, fmt.Sprintf("gotrain: warning: no hot standbys (--standby auto): they need %s available (%s, one standby per rank holding about its RSS, plus %s to spare) but %s is (MemAvailable, of %s); --standby=on keeps them anyway",
		bytesText(need+reserve), bytesText(need), bytesText(reserve), bytesText(avail), bytesText(total))
}

// bytesText writes n as a person reads memory sizes: MiB below 1 GiB, GiB
// with two decimals below 10 GiB (so that a need and what is available a
// little short of it read apart), else one.
func bytesText(n uint64) string {
	switch {
	case n < 1<<30:
		return fmt.Sprintf("%d MiB", (n+1<<19)>>20)
	case n < 10<<30:
		return fmt.Sprintf("%.2f GiB", float64(n)/(1<<30))
	}
	return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
}

// standbyGPUs is what a standby for a slot on gpu sees: the node's GPUs of
// the job in local-rank order as the workers do (node), when gpu is one of
// them, so that a rank it takes over can map its neighbours' memory
// (worker/pairreduce); else that GPU alone. Nothing for a CPU slot.
func standbyGPUs(gpu int, node []int) []int {
	switch {
	case gpu < 0:
		return nil
	case slices.Contains(node, gpu):
		return node
	}
	return []int{gpu}
}
