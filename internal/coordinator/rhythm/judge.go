package rhythm

import (
	"cmp"
	"slices"
	"time"
)

// JudgeConfig configures a Judge. The zero value of a field takes its
// default.
type JudgeConfig struct {
	// Window is how far back (in the ranks' completion times) a judgement
	// looks, as long as the samples in it still span MinCollectives; default
	// 5s.
	Window time.Duration
	// MinCollectives is how many collectives every rank must have completed
	// in the window for a judgement; default 4.
	MinCollectives int64
	// Slower is how much more compute per collective than the others'
	// median a rank must spend to be a suspect, as a fraction; default 0.2.
	Slower float64
	// MinExtra is the least extra compute per collective that counts, so
	// that noise on very fast collectives names nobody; default 10ms.
	MinExtra time.Duration
	// Streak is how many consecutive judgements must suspect the same rank
	// before it is named; default 3.
	Streak int
	// Recent is how many per-collective waits it keeps per rank; default 64.
	Recent int
}

// Defaults of JudgeConfig.
const (
	DefaultWindow         = 5 * time.Second
	DefaultMinCollectives = 4
	DefaultSlower         = 0.2
	DefaultMinExtra       = 10 * time.Millisecond
	DefaultStreak         = 3
	DefaultRecent         = 64
)

func (c JudgeConfig) withDefaults() JudgeConfig {
	c.Window = cmp.Or(c.Window, DefaultWindow)
	c.MinCollectives = cmp.Or(c.MinCollectives, DefaultMinCollectives)
	c.Slower = cmp.Or(c.Slower, DefaultSlower)
	c.MinExtra = cmp.Or(c.MinExtra, DefaultMinExtra)
	c.Streak = cmp.Or(c.Streak, DefaultStreak)
	c.Recent = cmp.Or(c.Recent, DefaultRecent)
	return c
}

// Sample is one rank's progress in one communicator, as of its last
// completed collective.
type Sample struct {
	Rank int
	// Seq is the last collective the rank completed, At when (its clock).
	Seq int64
	At  time.Time
	// Wait is the total time its completed collectives took.
	Wait time.Duration
	// RecentWaits, when the worker sends them, are the times the
	// collectives RecentFirst, RecentFirst+1, ... took for this rank.
	RecentFirst int64
	RecentWaits []time.Duration
}

// Finding is a judgement about one rank.
type Finding struct {
	Rank int
	// Slower is how much more compute per collective the rank spends than
	// the median of the others, as a fraction (1.5: 150 % slower).
	Slower float64
	// Compute is the rank's compute per collective, Others the median of
	// the other ranks'.
	Compute, Others time.Duration
	// Collectives is how many collectives the judgement spans.
	Collectives int64
	// LastShare is the fraction of the Common recent collectives at which
	// the rank waited least (arrived last); Common is 0 when the workers
	// send no per-collective waits.
	LastShare float64
	Common    int
}

// Change says what an observation changed.
type Change int

const (
	// Unchanged: the finding in force (or none) stays.
	Unchanged Change = iota
	// Named: a rank is named a straggler (or another replaces it).
	Named
	// Cleared: the rank named caught up; no straggler now.
	Cleared
)

// Judge names the straggler of one communicator.
type Judge struct {
	cfg     JudgeConfig
	hist    map[int][]point
	recent  map[int]map[int64]time.Duration
	cand    int
	streak  int
	current *Finding
}

type point struct {
	seq  int64
	at   time.Time
	wait time.Duration
}

// NewJudge returns a Judge with cfg (defaults filled in).
func NewJudge(cfg JudgeConfig) *Judge {
	j := &Judge{cfg: cfg.withDefaults()}
	j.Reset()
	return j
}

// Reset forgets everything: a new generation.
func (j *Judge) Reset() {
	j.hist, j.recent, j.cand, j.streak, j.current = map[int][]point{}, map[int]map[int64]time.Duration{}, -1, 0, nil
}

// Current returns the finding in force.
func (j *Judge) Current() (Finding, bool) {
	if j.current == nil {
		return Finding{Rank: -1}, false
	}
	return *j.current, true
}

// Observe takes one sample per rank (ranks without one are not judged; no
// judgement is made unless every rank of samples has enough history) and
// returns the finding in force and what changed.
func (j *Judge) Observe(samples []Sample) (Finding, Change) {
	computes := map[int]time.Duration{}
	spans := map[int]int64{}
	var low int64 = -1 // the oldest seq every rank's window covers
	for _, s := range samples {
		j.remember(s)
		if s.At.IsZero() {
			continue
		}
		h := j.record(s)
		first, last := h[0], h[len(h)-1]
		n := last.seq - first.seq
		if n < j.cfg.MinCollectives {
			continue
		}
		computes[s.Rank] = (last.at.Sub(first.at) - (last.wait - first.wait)) / time.Duration(n)
		spans[s.Rank] = n
		if low < 0 || first.seq > low {
			low = first.seq
		}
	}
	if len(samples) < 2 || len(computes) < len(samples) {
		return j.unchanged()
	}
	ranks, cand := slowest(computes)
	med := median(computes, cand)
	f := Finding{Rank: cand, Compute: computes[cand], Others: med, Collectives: spans[cand]}
	extra := f.Compute - med
	f.Slower = ratio(extra, med)
	f.LastShare, f.Common = j.lastShare(cand, ranks, low)
	suspect := f.Slower >= j.cfg.Slower && extra >= j.cfg.MinExtra
	if j.current != nil {
		cur := j.current.Rank
		m := median(computes, cur)
		if e := computes[cur] - m; ratio(e, m) < j.cfg.Slower/2 || e < j.cfg.MinExtra/2 {
			j.current, j.cand, j.streak = nil, -1, 0
			return Finding{Rank: -1}, Cleared
		}
		if cur == cand {
			j.current = &f // the figures stay fresh
			return f, Unchanged
		}
	}
	if !suspect {
		j.cand, j.streak = -1, 0
		return j.unchanged()
	}
	if cand == j.cand {
		j.streak++
	} else {
		j.cand, j.streak = cand, 1
	}
	if j.streak < j.cfg.Streak {
		return j.unchanged()
	}
	if j.current != nil && j.current.Rank == cand {
		return *j.current, Unchanged
	}
	j.current = &f
	return f, Named
}

// record adds sample s (which has a time) to its rank's history, drops
// the points the window no longer needs, and returns the history.
func (j *Judge) record(s Sample) []point {
	h := j.hist[s.Rank]
	if n := len(h); n == 0 || h[n-1].seq != s.Seq {
		if n > 0 && (s.Seq < h[n-1].seq || s.At.Before(h[n-1].at)) {
			h = nil // the rank started over
		}
		h = append(h, point{seq: s.Seq, at: s.At, wait: s.Wait})
	}
	// Drop the oldest point while the rest still span both Window and
	// MinCollectives.
	for len(h) > 2 && h[len(h)-1].at.Sub(h[1].at) >= j.cfg.Window && h[len(h)-1].seq-h[1].seq >= j.cfg.MinCollectives {
		h = h[1:]
	}
	j.hist[s.Rank] = h
	return h
}

// slowest returns the ranks of computes in order and the one with the
// most compute per collective (the lowest such rank on a tie).
func slowest(computes map[int]time.Duration) (ranks []int, cand int) {
	ranks = make([]int, 0, len(computes))
	for r := range computes {
		ranks = append(ranks, r)
	}
	slices.Sort(ranks)
	cand = ranks[0]
	for _, r := range ranks {
		if computes[r] > computes[cand] {
			cand = r
		}
	}
	return ranks, cand
}

// ratio is extra/base; 1e9 when base is nothing measurable and extra is.
func ratio(extra, base time.Duration) float64 {
	switch {
	case base > 0:
		return float64(extra) / float64(base)
	case extra > 0:
		return 1e9
	}
	return 0
}

func (j *Judge) unchanged() (Finding, Change) {
	f, _ := j.Current()
	return f, Unchanged
}

// median returns the median compute of the ranks other than skip.
func median(computes map[int]time.Duration, skip int) time.Duration {
	var o []time.Duration
	for r, c := range computes {
		if r != skip {
			o = append(o, c)
		}
	}
	slices.Sort(o)
	if len(o) == 0 {
		return 0
	}
	m := o[len(o)/2]
	if len(o)%2 == 0 {
		m = (o[len(o)/2-1] + m) / 2
	}
	return m
}

// remember keeps the per-collective waits of a sample.
func (j *Judge) remember(s Sample) {
	if len(s.RecentWaits) == 0 {
		return
	}
	m := j.recent[s.Rank]
	if m == nil {
		m = map[int64]time.Duration{}
		j.recent[s.Rank] = m
	}
	for i, w := range s.RecentWaits {
		m[s.RecentFirst+int64(i)] = w
	}
	for seq := range m {
		if seq <= s.RecentFirst+int64(len(s.RecentWaits))-int64(j.cfg.Recent) {
			delete(m, seq)
		}
	}
}

// lastShare is the fraction of the collectives after seq low that every rank
// has a wait for at which rank waited least, and how many there were.
func (j *Judge) lastShare(rank int, ranks []int, low int64) (float64, int) {
	mine := j.recent[rank]
	if len(mine) == 0 {
		return 0, 0
	}
	common, last := 0, 0
	for seq, w := range mine {
		if seq <= low {
			continue
		}
		least, all := true, true
		for _, r := range ranks {
			if r == rank {
				continue
			}
			ow, ok := j.recent[r][seq]
			if !ok {
				all = false
				break
			}
			if ow <= w {
				least = false
			}
		}
		if !all {
			continue
		}
		common++
		if least {
			last++
		}
	}
	if common == 0 {
		return 0, 0
	}
	return float64(last) / float64(common), common
}
