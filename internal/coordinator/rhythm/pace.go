package rhythm

import (
	"cmp"
	"slices"
	"time"
)

// PaceConfig configures a Pace. The zero value of a field takes its default.
type PaceConfig struct {
	// Warmup: intervals that start before this seq of a generation are not
	// counted; default 5.
	Warmup int64
	// MinIntervals is how many intervals it needs before it gives a timeout;
	// default 5.
	MinIntervals int
	// Window is how many of the latest intervals it keeps; default 256.
	Window int
	// Multiplier times the p99 interval is the timeout; default 3.
	Multiplier float64
	// Floor is the shortest timeout it gives; default 1s.
	Floor time.Duration
}

// Defaults of PaceConfig.
const (
	DefaultWarmup       = 5
	DefaultMinIntervals = 5
	DefaultPaceWindow   = 256
	DefaultMultiplier   = 3.0
	DefaultFloor        = time.Second
)

func (c PaceConfig) withDefaults() PaceConfig {
	c.Warmup = cmp.Or(c.Warmup, DefaultWarmup)
	c.MinIntervals = cmp.Or(c.MinIntervals, DefaultMinIntervals)
	c.Window = cmp.Or(c.Window, DefaultPaceWindow)
	c.Multiplier = cmp.Or(c.Multiplier, DefaultMultiplier)
	c.Floor = cmp.Or(c.Floor, DefaultFloor)
	return c
}

// Pace learns one communicator's interval between completions.
type Pace struct {
	cfg       PaceConfig
	seq       int64 // lowest completed seq last seen
	at        time.Time
	started   bool // seq/at hold a first observation of this generation
	intervals []time.Duration
	next      int // ring position once intervals is full
}

// NewPace returns a Pace with cfg (defaults filled in).
func NewPace(cfg PaceConfig) *Pace { return &Pace{cfg: cfg.withDefaults()} }

// Advance tells p that the lowest completed seq is seq, reached at reached
// (the workers' completion time) and seen at seen (when the caller learned
// of it). The interval counted runs from the previous seq's reached to this
// one's seen: at least as long as any stall the caller could have timed in
// between, report delays included. A seq that has not moved, or moved
// backwards (a new generation numbers from 0: call Restart), only moves the
// baseline.
func (p *Pace) Advance(seq int64, reached, seen time.Time) {
	if !p.started || seq < p.seq || reached.Before(p.at) {
		p.seq, p.at, p.started = seq, reached, true
		return
	}
	if seq == p.seq {
		return
	}
	if p.seq >= p.cfg.Warmup {
		if seen.Before(reached) {
			seen = reached
		}
		p.add(seen.Sub(p.at))
	}
	p.seq, p.at = seq, reached
}

func (p *Pace) add(d time.Duration) {
	if len(p.intervals) < p.cfg.Window {
		p.intervals = append(p.intervals, d)
		return
	}
	p.intervals[p.next] = d
	p.next = (p.next + 1) % p.cfg.Window
}

// Restart starts a new generation: seqs number from the start again and the
// warm-up is left out again. The intervals learned so far are kept.
func (p *Pace) Restart() { p.started = false }

// P99 returns the 99th percentile of the intervals kept (the largest while
// fewer than 100 are in), and how many there are.
func (p *Pace) P99() (time.Duration, int) {
	n := len(p.intervals)
	if n == 0 {
		return 0, 0
	}
	s := slices.Clone(p.intervals)
	slices.Sort(s)
	i := (99*n + 99) / 100 // ceil(0.99 n)
	return s[i-1], n
}

// Timeout returns the hang timeout the rhythm gives, max(Multiplier × p99,
// Floor), and false while fewer than MinIntervals intervals are in.
func (p *Pace) Timeout() (time.Duration, bool) {
	p99, n := p.P99()
	if n < p.cfg.MinIntervals {
		return 0, false
	}
	return max(time.Duration(p.cfg.Multiplier*float64(p99)), p.cfg.Floor), true
}
