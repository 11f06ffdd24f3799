// Package recovery decides where a restart's time went, phase by phase,
// from the facts the agent gathers: when this node saw the failure, when
// the coordinator ended the generation, when the old processes were gone,
// when the next generation started and each rank's process with it (a
// standby or a cold start), and what the torch hook recorded in each new
// process (init_process_group, a restore the snapshot module reported, the
// first collective). [Decide] turns them into a [Timing]; [Timing.Line] is
// the line the agent prints:
//
//	gotrain: recovered in 1.80 s: detected 0.01 · stopped 0.20 · started 0.05 (standby) · imports 0.30 · init_process_group 0.40 · restored 1.6 GB from agent memory 0.15 · first step 0.69
//
// It is pure (no clock, no I/O): the shell gathers the facts, this decides
// which interval is which phase, and a table test pins it down.
package recovery

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// Event is one thing the torch hook recorded in a rank's process, with the
// worker's wall clock (the agent's: same machine).
type Event struct {
	// Name: "init_process_group" (Start, End), "collective" (End: a
	// collective completed, the first after init_process_group or a
	// phase the program reported), or a phase the program reported
	// through the hook ("restore": End and Seconds, with Bytes, Source
	// "agent" or "peer", Step).
	Name       string
	Start, End time.Time
	Seconds    float64
	Bytes      int64
	Source     string
	Step       int64
}

// Rank is one rank of the new generation on this node.
type Rank struct {
	Rank int
	// Started is when its process got the rank: spawned, or the standby
	// handed it; Standby says which.
	Started time.Time
	Standby bool
	// Events are what its process recorded (the torch hook), in any order.
	Events []Event
}

// Facts are what the agent knows of one restart on its node.
type Facts struct {
	Generation int64 // the new generation
	// Failed: this node saw the failure (a rank's exit here, else the
	// coordinator's end of the generation); Ended: the coordinator ended
	// the generation; Stopped: the old generation's last process here was
	// gone; Started: the new generation started here. A zero time is not
	// known and its phase is left out.
	Failed, Ended, Stopped, Started time.Time
	Ranks                           []Rank
	// Program: the ranks run a program the torch hook records
	// (init_process_group, first collective); without, the launcher's
	// phases are the whole story.
	Program bool
}

// Phase is one interval of a recovery.
type Phase struct {
	Name    string  `json:"name"`
	Seconds float64 `json:"seconds"`
	// Detail says more, where there is more: "standby" or "cold" for
	// started, the bytes and source for restored.
	Detail string `json:"detail,omitempty"`
}

// Restore is the restore the program reported, when it did.
type Restore struct {
	Bytes  int64  `json:"bytes"`
	Source string `json:"source"`
	Step   int64  `json:"step"`
}

// Timing is where one node's recovery went: the phases of its slowest
// rank (the last to complete its first collective), in order.
type Timing struct {
	Generation int64    `json:"generation"`
	Rank       int      `json:"rank"`
	Total      float64  `json:"seconds"`
	Phases     []Phase  `json:"phases"`
	Restore    *Restore `json:"restore,omitempty"`
	// Missing names what did not happen (yet): "init_process_group",
	// "first step"; empty when the recovery is complete.
	Missing []string `json:"missing,omitempty"`
}

// Phase names, as the line and the metrics' phase label say them.
const (
	Detected   = "detected"
	Stopped    = "stopped"
	Rendezvous = "rendezvous"
	Started    = "started"
	Imports    = "imports"
	InitPG     = "init_process_group"
	Setup      = "setup"
	Restored   = "restored"
	FirstStep  = "first step"
)

// Names lists every phase in the order they happen without a restore
// before init_process_group.
var Names = []string{Detected, Stopped, Rendezvous, Started, Imports, InitPG, Setup, Restored, FirstStep}

// mark is a point of the timeline; the phase ending at it is named from it
// and the mark before it.
type mark struct {
	at   time.Time
	kind string
}

const (
	mFailed, mEnded, mStopped, mGen, mProc = "failed", "ended", "stopped", "gen", "proc"
	mInit, mInitDone, mRestore, mRestored  = "init", "init-done", "restore", "restored"
	mFirst                                 = "first"
)

// program picks a rank's program marks from its events: the first
// init_process_group, the last restore, and the first collective that
// completed after both.
func program(r Rank) (marks []mark, restore *Restore, missing []string) {
	var init, rest *Event
	for i := range r.Events {
		e := &r.Events[i]
		switch e.Name {
		case "init_process_group":
			if init == nil || e.Start.Before(init.Start) {
				init = e
			}
		case "restore":
			if rest == nil || e.End.After(rest.End) {
				rest = e
			}
		}
	}
	if init == nil || init.End.IsZero() {
		return nil, nil, []string{InitPG, FirstStep}
	}
	marks = []mark{{init.Start, mInit}, {init.End, mInitDone}}
	after := init.End
	if rest != nil {
		start := rest.End.Add(-time.Duration(rest.Seconds * float64(time.Second)))
		marks = append(marks, mark{start, mRestore}, mark{rest.End, mRestored})
		restore = &Restore{Bytes: rest.Bytes, Source: rest.Source, Step: rest.Step}
		if rest.End.After(after) {
			after = rest.End
		}
	}
	var first time.Time
	for _, e := range r.Events {
		if e.Name == "collective" && !e.End.Before(after) && (first.IsZero() || e.End.Before(first)) {
			first = e.End
		}
	}
	if first.IsZero() {
		return marks, restore, []string{FirstStep}
	}
	return append(marks, mark{first, mFirst}), restore, nil
}

// Decide works out the recovery of f's node. A rank whose program has not
// recorded its first step yet makes the timing incomplete (Missing says
// what); the shell waits for it or gives up and reports what it has.
func Decide(f Facts) Timing {
	t := Timing{Generation: f.Generation, Rank: -1}
	if len(f.Ranks) == 0 {
		return t
	}
	// The node is done when its last rank is: that rank's phases tell.
	var pick Rank
	var marks []mark
	var restore *Restore
	var missing []string
	var end time.Time
	for i, r := range f.Ranks {
		var ms []mark
		var rs *Restore
		var miss []string
		if f.Program {
			ms, rs, miss = program(r)
		}
		e := r.Started
		if len(ms) > 0 {
			e = ms[len(ms)-1].at
		}
		worse := len(miss) > len(missing) || len(miss) == len(missing) && e.After(end)
		if i == 0 || worse {
			pick, marks, restore, missing, end = r, ms, rs, miss, e
		}
	}
	t.Rank, t.Restore, t.Missing = pick.Rank, restore, missing
	line := []mark{{f.Failed, mFailed}, {f.Ended, mEnded}, {f.Stopped, mStopped}, {f.Started, mGen}, {pick.Started, mProc}}
	line = slices.DeleteFunc(line, func(m mark) bool { return m.at.IsZero() })
	line = append(line, marks...)
	// Launcher marks come in their own order; the program's are sorted by
	// time (a restore may come before init_process_group).
	n := len(line) - len(marks)
	slices.SortStableFunc(line[n:], func(a, b mark) int { return a.at.Compare(b.at) })
	if len(line) < 2 {
		return t
	}
	initDone := false
	for i := 1; i < len(line); i++ {
		prev, m := line[i-1], line[i]
		d := max(m.at.Sub(prev.at), 0)
		var p Phase
		switch m.kind {
		case mEnded:
			p = Phase{Name: Detected}
		case mStopped:
			p = Phase{Name: Stopped}
		case mGen:
			p = Phase{Name: Rendezvous}
		case mProc:
			p = Phase{Name: Started, Detail: "cold"}
			if pick.Standby {
				p.Detail = "standby"
			}
		case mInit, mRestore:
			p = Phase{Name: Imports}
			if prev.kind == mRestored || initDone {
				p.Name = Setup
			}
		case mInitDone:
			p, initDone = Phase{Name: InitPG}, true
		case mRestored:
			p = Phase{Name: Restored, Detail: restoreDetail(restore)}
		case mFirst:
			p = Phase{Name: FirstStep}
		}
		if (p.Name == Rendezvous || p.Name == Setup) && d < 5*time.Millisecond {
			continue // nothing in between to speak of (the next generation was there at once)
		}
		p.Seconds = d.Seconds()
		t.Phases = append(t.Phases, p)
	}
	t.Total = max(line[len(line)-1].at.Sub(line[0].at), 0).Seconds()
	return t
}

// restoreDetail says what a restore brought back and from where: "1.6 GB
// from agent memory".
func restoreDetail(r *Restore) string {
	if r == nil {
		return ""
	}
	from := "from " + r.Source
	switch r.Source {
	case "agent":
		from = "from agent memory"
	case "peer":
		from = "from a peer's agent"
	case "":
		from = ""
	}
	return strings.TrimSpace(bytesText(r.Bytes) + " " + from)
}

func bytesText(n int64) string {
	switch {
	case n <= 0:
		return ""
	case n >= 1e9:
		return fmt.Sprintf("%.1f GB", float64(n)/1e9)
	case n >= 1e6:
		return fmt.Sprintf("%.0f MB", float64(n)/1e6)
	}
	return fmt.Sprintf("%.0f kB", float64(n)/1e3)
}

// Line is what the agent prints: "gotrain: recovered in 1.80 s: detected
// 0.01 · stopped 0.20 · …"; an incomplete timing says what is missing.
func (t Timing) Line() string {
	parts := make([]string, 0, len(t.Phases))
	for _, p := range t.Phases {
		switch {
		case p.Name == Restored:
			parts = append(parts, strings.TrimSpace(fmt.Sprintf("restored %s %.2f", p.Detail, p.Seconds)))
		case p.Detail != "":
			parts = append(parts, fmt.Sprintf("%s %.2f (%s)", p.Name, p.Seconds, p.Detail))
		default:
			parts = append(parts, fmt.Sprintf("%s %.2f", p.Name, p.Seconds))
		}
	}
	s := fmt.Sprintf("gotrain: recovered in %.2f s: %s", t.Total, strings.Join(parts, " · "))
	if len(t.Missing) > 0 {
		s = fmt.Sprintf("gotrain: recovery of generation %d so far (rank %d has no %s recorded yet) %.2f s: %s",
			t.Generation, t.Rank, strings.Join(t.Missing, " or "), t.Total, strings.Join(parts, " · "))
	}
	return s
}
