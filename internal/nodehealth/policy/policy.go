// Package policy is the node-health policy, pure: a machine's verdicts
// (Record) and the time in, whether it may join an elastic job out
// (Decide). Package nodehealth keeps the records in a local file; the
// coordinator keeps them in its replicated state; both decide with Decide.
package policy

import (
	"fmt"
	"slices"
	"time"
)

// Kind is what happened to the node.
type Kind string

// The kinds of record.
const (
	Preflight Kind = "preflight" // it failed a preflight check
	Lost      Kind = "lost"      // it left a running job (its agent or link went away)
	Straggler Kind = "straggler" // it was dropped from a job as a straggler
	XID       Kind = "xid"       // its GPU reported an XID error during a job
)

// Counts says whether a record of kind k counts against the machine. A
// node that lost its coordinator cannot tell its own fault (a cable) from
// the coordinator's (its node died): that is kept for the history, never
// held against the machine.
func (k Kind) Counts() bool { return k != Lost }

// Valid says whether k is a kind of record.
func (k Kind) Valid() bool {
	switch k {
	case Preflight, Lost, Straggler, XID:
		return true
	}
	return false
}

// Record is one verdict against a machine.
type Record struct {
	Time   time.Time `json:"time"`
	Host   string    `json:"host"`
	Kind   Kind      `json:"kind"`
	Check  string    `json:"check,omitempty"`
	Detail string    `json:"detail,omitempty"`
	RunID  string    `json:"run_id,omitempty"`
}

// Policy is when a machine is kept out: Failures records within Window
// (of the kinds that count: not Lost) keep it out of elastic jobs for
// CoolOff after the last of them.
type Policy struct {
	Failures int
	Window   time.Duration
	CoolOff  time.Duration
}

// DefaultPolicy: twice within a day keeps a machine out for six hours —
// bad nodes repeat, and a node that failed twice is likely to fail again
// soon, while a transient fault (a reboot, a driver reload) is gone in hours.
var DefaultPolicy = Policy{Failures: 2, Window: 24 * time.Hour, CoolOff: 6 * time.Hour}

// Decision says whether host may join an elastic job now.
type Decision struct {
	Admit bool
	// Until is when the cool-off ends (zero when admitted); Because the
	// records that started it; Line the one line a person reads.
	Until   time.Time
	Because []Record
	Line    string
}

// Decide applies p to host's records at now.
func Decide(recs []Record, host string, now time.Time, p Policy) Decision {
	var mine []Record
	for _, r := range recs {
		if r.Host == host && r.Kind.Counts() && !r.Time.After(now) {
			mine = append(mine, r)
		}
	}
	slices.SortStableFunc(mine, func(a, b Record) int { return a.Time.Compare(b.Time) })
	var until time.Time
	var because []Record
	for i, r := range mine {
		first := i
		for first > 0 && r.Time.Sub(mine[first-1].Time) <= p.Window {
			first--
		}
		if n := i - first + 1; n >= p.Failures {
			if end := r.Time.Add(p.CoolOff); end.After(until) {
				until, because = end, mine[i-p.Failures+1:i+1]
			}
		}
	}
	if p.Failures <= 0 || !now.Before(until) {
		return Decision{Admit: true}
	}
	last := because[len(because)-1]
	line := fmt.Sprintf("gotrain: this machine (%s) failed %d times within %s (last: %s %s at %s); it stays out of elastic jobs (--nnodes MIN:MAX) until %s; `gotrain doctor --history` shows its record",
		host, len(because), p.Window, last.Kind, last.Check, last.Time.UTC().Format(time.RFC3339), until.UTC().Format(time.RFC3339))
	return Decision{Admit: false, Until: until, Because: because, Line: line}
}
