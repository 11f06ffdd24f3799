// The straggler check: a rank the others consistently wait for
// (VerdictStraggler), judged from the ranks' wait times over a window. A
// finding, not a hang.

package job

import (
	"fmt"
	"slices"
	"time"
)

const (
	// stragglerWindow is how far back the straggler check looks.
	stragglerWindow = 30 * time.Second
	// stragglerMinCollectives is how many collectives each rank must have
	// completed in the window for the check to judge.
	stragglerMinCollectives = 4
	// stragglerStreak is how many consecutive ticks must name the same rank.
)

type stragglerWatch struct {
	samples map[int][]waitSample
	cand    int
	streak  int
	on      bool
}

type waitSample struct {
	at   time.Time
	seq  int64
	wait time.Duration
}

// stragglerCheck names a rank the others consistently wait for.
func (m *Machine) stragglerCheck(name string, w *commWatch, vs []rankView) []Action {
	s := &w.strag
	means := map[int]time.Duration{}
	for _, rv := range vs {
		if rv.c == nil {
			continue
		}
		ss := s.samples[rv.rank]
		if len(ss) == 0 || ss[len(ss)-1].seq != rv.c.CompletedSeq {
			ss = append(ss, waitSample{at: rv.p.Received, seq: rv.c.CompletedSeq, wait: rv.c.Wait})
		}
		for len(ss) > 2 && m.now.Sub(ss[1].at) > stragglerWindow {
			ss = ss[1:]
		}
		s.samples[rv.rank] = ss
		first, last := ss[0], ss[len(ss)-1]
		if n := last.seq - first.seq; n >= stragglerMinCollectives {
			means[rv.rank] = (last.wait - first.wait) / time.Duration(n)
		}
	}
	if len(means) < 2 || len(means) < len(vs) {
		return nil
	}
	cand, others := -1, []time.Duration{}
	for r := range vs {
		if cand < 0 || means[r] < means[cand] {
			cand = r
		}
	}
	for r := range vs {
		if r != cand {
			others = append(others, means[r])
		}
	}
	slices.Sort(others)
	gap := others[len(others)/2] - means[cand]
	switch {
	case gap >= m.cfg.StragglerThreshold:
		if cand == s.cand {
			s.streak++
		} else {
			s.cand, s.streak = cand, 1
			if s.on {
				s.on = false
				m.hang.drop(name, true)
			}
		}
	case gap < m.cfg.StragglerThreshold/2 && s.on:
		s.on, s.streak = false, 0
		m.hang.drop(name, true)
		return nil
	default:
		s.streak = 0
		return nil
	}
	if s.on || s.streak < stragglerStreak {
		return nil
	}
	s.on = true
	c := m.culprit(vs[cand], vs[cand].completed+1)
	c.Doing = fmt.Sprintf("enters collectives last: the other ranks wait %s longer per collective (median %s against its %s)",
		gap.Round(time.Millisecond), others[len(others)/2].Round(time.Millisecond), means[cand].Round(time.Millisecond))
	v := Verdict{
		Kind: VerdictStraggler, Generation: m.gen, Comm: name,
		Collective: Collective{Seq: vs[cand].completed, Root: -1},
		Since:      m.now, Culprits: []Culprit{c},
		Summary: fmt.Sprintf("%s is a straggler in comm %q: the other ranks wait %s longer per collective for it (threshold %s)",
			who(c), name, gap.Round(time.Millisecond), m.cfg.StragglerThreshold),
	}
	v.Details = []string{fmt.Sprintf("%s: %s", who(c), c.Doing)}
	return []Action{m.record(v, false)}
}
