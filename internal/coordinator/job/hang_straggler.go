// The straggler check: a rank the others consistently wait for
// (VerdictStraggler), judged by package internal/coordinator/rhythm from the ranks'
// completion times and the time they waited in collectives. A finding, not
// a hang.

package job

import (
	"fmt"
	"time"

	"github.com/gotrain/gotrain/internal/coordinator/rhythm"
)

// stragglerCheck feeds communicator name's judge and records or withdraws
// its straggler verdict.
func (m *Machine) stragglerCheck(name string, w *commWatch, vs []rankView) []Action {
	samples := make([]rhythm.Sample, 0, len(vs))
	for _, rv := range vs {
		if rv.c == nil {
			return nil // a rank that reports nothing for the comm: no judgement
		}
		at := rv.c.CompletedTime
		if !at.IsZero() && rv.p.Received.Before(at) {
			at = rv.p.Received
		}
		samples = append(samples, rhythm.Sample{Rank: rv.rank, Seq: rv.c.CompletedSeq, At: at, Wait: rv.c.Wait,
			RecentFirst: rv.c.RecentFirst, RecentWaits: rv.c.RecentWaits})
	}
	f, ch := w.judge.Observe(samples)
	switch ch {
	case rhythm.Cleared:
		m.hang.drop(name, true)
		return nil
	case rhythm.Named:
		m.hang.drop(name, true)
	default:
		return nil
	}
	rv := vs[f.Rank]
	c := m.culprit(rv, rv.completed+1)
	c.Collective = nil
	fig := &StragglerFigures{Slower: f.Slower, Compute: f.Compute, Others: f.Others, LastShare: f.LastShare, Common: f.Common}
	c.Doing = stragglerDoing(fig)
	v := Verdict{
		Kind: VerdictStraggler, Generation: m.gen, Comm: name,
		Collective: Collective{Seq: rv.completed, Root: -1},
		Since:      m.now, Culprits: []Culprit{c}, Straggler: fig,
		Summary: fmt.Sprintf("%s is the straggler: %s", whereRank(c), stragglerWords(fig)),
	}
	v.Details = []string{fmt.Sprintf("%s: %s in comm %q", who(c), c.Doing, name)}
	if cause := m.stragglerCause(c.Rank); cause != "" { // straggler_cause.go
		v.Details = append(v.Details, cause)
	}
	return []Action{m.record(v, false)}
}

// whereRank is "rank 2 on host a".
func whereRank(c Culprit) string {
	if c.Hostname == "" {
		return fmt.Sprintf("rank %d", c.Rank)
	}
	return fmt.Sprintf("rank %d on host %s", c.Rank, c.Hostname)
}

// stragglerWords is "its steps are 100 % slower than the other ranks' (…)".
func stragglerWords(f *StragglerFigures) string {
	s := fmt.Sprintf("its steps are %.0f %% slower than the other ranks'", 100*f.Slower)
	if f.Common > 0 {
		s += fmt.Sprintf(" and it arrives last at %.0f %% of collectives", 100*f.LastShare)
	}
	return s
}

func stragglerDoing(f *StragglerFigures) string {
	s := fmt.Sprintf("computes %s between collectives where the others' median is %s; they wait for it",
		f.Compute.Round(time.Millisecond), f.Others.Round(time.Millisecond))
	if f.Common > 0 {
		s += fmt.Sprintf("; last to arrive at %d of the last %d collectives", int(f.LastShare*float64(f.Common)+0.5), f.Common)
	}
	return s
}

// timeoutWords says how the adaptive hang timeout of a verdict came about.
func timeoutWords(name string, d time.Duration, p *rhythm.Pace) string {
	if _, ok := p.Timeout(); !ok {
		return fmt.Sprintf("hang timeout %s: the default, as comm %q had not yet run long enough to learn its rhythm", d, name)
	}
	p99, n := p.P99()
	return fmt.Sprintf("hang timeout %s: adaptive, max(3 x p99 %s of the last %d intervals between completions of comm %q, 1s)",
		d.Round(time.Millisecond), p99.Round(time.Millisecond), n, name)
}
