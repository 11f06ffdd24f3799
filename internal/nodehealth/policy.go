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
	"time"

	"github.com/gotrain/gotrain/internal/nodehealth/policy"
)

// The policy lives in package policy, which the coordinator's replicated
// state uses too: these are its names here.
type (
	Kind     = policy.Kind
	Record   = policy.Record
	Policy   = policy.Policy
	Decision = policy.Decision
)

// The kinds of record.
const (
	Preflight = policy.Preflight
	Lost      = policy.Lost
	Straggler = policy.Straggler
	XID       = policy.XID
)

// DefaultPolicy is policy.DefaultPolicy.
var DefaultPolicy = policy.DefaultPolicy

// Decide is policy.Decide.
func Decide(recs []Record, host string, now time.Time, p Policy) Decision {
	return policy.Decide(recs, host, now, p)
}
