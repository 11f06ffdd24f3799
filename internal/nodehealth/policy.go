// Package nodehealth is a machine's health record: every verdict against it
// (a failed preflight, the node lost from a job, a straggler dropped, an
// XID) as a line in a small local file, and the policy that keeps a repeat
// offender out of elastic jobs for a while.
//
// The file (ledger.go) is this user's, mode 0600, bounded in size, and read
// as untrusted input: a line that does not parse or is out of bounds is
// skipped and counted, never acted on. The policy (Decide) is pure: the
// records and the time in, the decision out.
//
// # Usage
//
//	l := nodehealth.Open(nodehealth.DefaultPath(os.Getenv))
//	recs, _, _ := l.Read()
//	if d := nodehealth.Decide(recs, host, time.Now(), nodehealth.DefaultPolicy); !d.Admit {
//		fmt.Fprintln(os.Stderr, d.Line)
//	}
//	l.Append(nodehealth.Record{Time: time.Now(), Host: host, Kind: nodehealth.Preflight, Check: "cpu-allreduce-bandwidth", Detail: "12 MB/s"})
package nodehealth

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

// counts says whether a record of kind k counts against the machine. A
// node that lost its coordinator cannot tell its own fault (a cable) from
// the coordinator's (its node died): that is kept for the history, never
// held against the machine.
func (k Kind) counts() bool { return k != Lost }

func (k Kind) valid() bool {
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
		if r.Host == host && r.Kind.counts() && !r.Time.After(now) {
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
