package output

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/gotrain/gotrain/internal/launcher/supervise"
)

// How the workers' output reaches the console: each line under its rank's
// prefix (the default), or raw, byte for byte as the worker wrote it
// (torchrun's way, which `gotrain torchrun` takes with one rank, so that
// `gotrain torchrun eval.py > out.json` is the program's JSON). Which local
// ranks' streams are printed at all is the Options' other half: torchrun's
// --redirects (a stream goes to its log file only) and --local-ranks-filter
// (only these local ranks on the console). Log files (--log-dir) always get
// everything.

// Mode is how a worker's output is printed.
type Mode string

const (
	Prefixed Mode = "prefixed" // "[rank N] " before each line
	Raw      Mode = "raw"      // the bytes as written
)

// ParseMode reads --output's value.
func ParseMode(s string) (Mode, error) {
	switch m := Mode(s); m {
	case Prefixed, Raw:
		return m, nil
	}
	return "", fmt.Errorf("--output %q: want prefixed or raw", s)
}

// Streams is a set of a worker's output streams, numbered as torchrun's
// Std: 0 none, 1 stdout, 2 stderr, 3 both.
type Streams uint8

const (
	NoStreams  Streams = 0
	StdoutOnly Streams = 1
	StderrOnly Streams = 2
	AllStreams Streams = 3
)

func (s Streams) has(stream supervise.Stream) bool {
	switch stream {
	case supervise.Stdout:
		return s&StdoutOnly != 0
	case supervise.Stderr:
		return s&StderrOnly != 0
	}
	return false
}

// PerRankStreams is torchrun's --redirects/--tee value: one Streams for
// every local rank ("3"), or some local ranks' ("0:3,1:0"; the others:
// none).
type PerRankStreams struct {
	All   Streams
	Ranks map[int]Streams // nil: All applies to every local rank
}

// ParsePerRankStreams reads torchrun's syntax (flag names the flag for
// errors).
func ParsePerRankStreams(flag, s string) (PerRankStreams, error) {
	bad := func() (PerRankStreams, error) {
		return PerRankStreams{}, fmt.Errorf("--%s %q: give 0 (none), 1 (stdout), 2 (stderr) or 3 (both), for every local rank or as LOCAL_RANK:N,... (e.g. 0:3,1:2)", flag, s)
	}
	one := func(v string) (Streams, bool) {
		n, err := strconv.Atoi(strings.TrimSpace(v))
		return Streams(n), err == nil && n >= 0 && n <= 3
	}
	if !strings.Contains(s, ":") {
		st, ok := one(s)
		if !ok {
			return bad()
		}
		return PerRankStreams{All: st}, nil
	}
	p := PerRankStreams{Ranks: map[int]Streams{}}
	for _, part := range strings.Split(s, ",") {
		r, v, _ := strings.Cut(part, ":")
		rank, err := strconv.Atoi(strings.TrimSpace(r))
		st, ok := one(v)
		if err != nil || rank < 0 || !ok {
			return bad()
		}
		p.Ranks[rank] = st
	}
	return p, nil
}

func (p PerRankStreams) of(local int) Streams {
	if p.Ranks == nil {
		return p.All
	}
	return p.Ranks[local]
}

// String writes p back in torchrun's syntax.
func (p PerRankStreams) String() string {
	if p.Ranks == nil {
		return strconv.Itoa(int(p.All))
	}
	var parts []string
	for _, r := range slices.Sorted(maps.Keys(p.Ranks)) {
		parts = append(parts, fmt.Sprintf("%d:%d", r, p.Ranks[r]))
	}
	return strings.Join(parts, ",")
}

// Options are how the workers' output is printed.
type Options struct {
	Mode Mode // "": prefixed
	// Redirects are the streams printed only into the log files (torchrun's
	// --redirects); they need a log dir.
	Redirects PerRankStreams
	// ConsoleRanks, when not nil, are the local ranks whose output is
	// printed (torchrun's --local-ranks-filter); the others' goes to their
	// log files only.
	ConsoleRanks []int
}

// shows says whether local rank's stream is printed on the console. A
// standby is filtered as the local rank of its slot.
func (o Options) shows(local int, stream supervise.Stream) bool {
	if o.ConsoleRanks != nil && !slices.Contains(o.ConsoleRanks, local) {
		return false
	}
	return !o.Redirects.of(local).has(stream)
}

// HidesAny says whether some output goes to the log files alone, which then
// must exist.
func (o Options) HidesAny() bool {
	if o.ConsoleRanks != nil {
		return true
	}
	if o.Redirects.Ranks == nil {
		return o.Redirects.All != NoStreams
	}
	for _, s := range o.Redirects.Ranks {
		if s != NoStreams {
			return true
		}
	}
	return false
}
