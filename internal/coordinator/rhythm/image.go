package rhythm

import (
	"errors"
	"maps"
	"slices"
	"time"
)

// ErrBadImage is returned for an image no Pace or Judge could hold.
var ErrBadImage = errors.New("rhythm: bad image")

// PaceImage is a Pace's state as plain data (a replica's snapshot).
type PaceImage struct {
	Cfg       PaceConfig
	Seq       int64
	At        time.Time
	Started   bool
	Intervals []time.Duration
	Next      int
}

// Image returns p's state.
func (p *Pace) Image() PaceImage {
	return PaceImage{Cfg: p.cfg, Seq: p.seq, At: p.at, Started: p.started, Intervals: slices.Clone(p.intervals), Next: p.next}
}

// PaceFromImage returns the Pace im holds, or ErrBadImage when im breaks
// a bound Advance relies on (a ring larger than its window, a position
// outside it).
func PaceFromImage(im PaceImage) (*Pace, error) {
	p := NewPace(im.Cfg)
	if p.cfg.Window < 1 || len(im.Intervals) > p.cfg.Window || im.Next < 0 || im.Next > len(im.Intervals) {
		return nil, ErrBadImage
	}
	p.seq, p.at, p.started, p.intervals, p.next = im.Seq, im.At, im.Started, slices.Clone(im.Intervals), im.Next
	return p, nil
}

// JudgeImage is a Judge's state as plain data (a replica's snapshot).
type JudgeImage struct {
	Cfg     JudgeConfig
	Hist    map[int][]PointImage
	Recent  map[int]map[int64]time.Duration
	Cand    int
	Streak  int
	Current *Finding
}

// PointImage is one point of a rank's history.
type PointImage struct {
	Seq  int64
	At   time.Time
	Wait time.Duration
}

// Image returns j's state.
func (j *Judge) Image() JudgeImage {
	im := JudgeImage{Cfg: j.cfg, Hist: map[int][]PointImage{}, Recent: map[int]map[int64]time.Duration{}, Cand: j.cand, Streak: j.streak}
	for r, h := range j.hist {
		ps := make([]PointImage, len(h))
		for i, p := range h {
			ps[i] = PointImage{Seq: p.seq, At: p.at, Wait: p.wait}
		}
		im.Hist[r] = ps
	}
	for r, m := range j.recent {
		im.Recent[r] = maps.Clone(m)
	}
	if j.current != nil {
		f := *j.current
		im.Current = &f
	}
	return im
}

// JudgeFromImage returns the Judge im holds, or ErrBadImage when a rank's
// history is empty (Observe reads its first and last points).
func JudgeFromImage(im JudgeImage) (*Judge, error) {
	j := NewJudge(im.Cfg)
	for r, ps := range im.Hist {
		if len(ps) == 0 {
			return nil, ErrBadImage
		}
		h := make([]point, len(ps))
		for i, p := range ps {
			h[i] = point{seq: p.Seq, at: p.At, wait: p.Wait}
		}
		j.hist[r] = h
	}
	for r, m := range im.Recent {
		if m == nil {
			m = map[int64]time.Duration{}
		}
		j.recent[r] = maps.Clone(m)
	}
	j.cand, j.streak = im.Cand, im.Streak
	if im.Current != nil {
		f := *im.Current
		j.current = &f
	}
	return j, nil
}
