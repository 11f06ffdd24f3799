package output

import (
	"fmt"
	"io"
	"os"
	"sync"

	"github.com/gotrain/gotrain/internal/launcher/supervise"
)

// Console serialises whole lines from many workers onto one writer, so that
// output of concurrent ranks never interleaves within a line.
type Console struct {
	mu sync.Mutex
	w  io.Writer
}

// NewConsole returns the console on w.
func NewConsole(w io.Writer) *Console { return &Console{w: w} }

// Write writes b as it is (raw output).
func (c *Console) Write(b []byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	_, _ = c.w.Write(b)
}

// WriteLine writes line under prefix, and a newline.
func (c *Console) WriteLine(prefix string, line []byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	_, _ = io.WriteString(c.w, prefix)
	_, _ = c.w.Write(line)
	_, _ = io.WriteString(c.w, "\n")
}

// Tail keeps the last n lines written to it.
type Tail struct {
	mu    sync.Mutex
	n     int
	lines []string
}

// NewTail returns a tail of n lines.
func NewTail(n int) *Tail { return &Tail{n: n} }

// Add adds a line.
func (t *Tail) Add(line string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.lines) == t.n {
		copy(t.lines, t.lines[1:])
		t.lines = t.lines[:t.n-1]
	}
	t.lines = append(t.lines, line)
}

// Snapshot returns the lines kept, oldest first.
func (t *Tail) Snapshot() []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return append([]string(nil), t.lines...)
}

// Route is where one worker's output goes: the console (under a prefix, or
// raw: output.go) and its log file. Both of a worker's pumps share it. A
// standby's route changes when it becomes a rank (relay/standby.go): until then
// its lines carry "[standby N] " and are held for the rank's log file, which
// it gets then.
type Route struct {
	mu     sync.Mutex
	prefix string
	rank   int // for the log file's last line
	// local is the local rank (a standby: its slot) that output filters on.
	local   int
	output  Options
	log     *os.File // nil: no log file (yet)
	holding bool     // keep output for a log file to come
	held    [][]byte // each as it goes into the log (lines with their newline)
	dropped int      // held pieces dropped beyond maxHeld
	// midLine: the log's last bytes (raw output) did not end a line.
	midLine bool
	// trouble is told when the log file cannot be written (a full disk).
	trouble *Trouble
}

// maxHeld bounds the pieces of output a standby holds for its log file.
const maxHeld = 1000

// Line takes one line of stream (without its newline).
func (rt *Route) Line(con *Console, stream supervise.Stream, b []byte) {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if rt.output.shows(rt.local, stream) {
		con.WriteLine(rt.prefix, b)
	}
	rt.toLog(append(b[:len(b):len(b)], '\n'))
}

// Chunk takes bytes of stream as the worker wrote them (raw output).
func (rt *Route) Chunk(con *Console, stream supervise.Stream, b []byte) {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if rt.output.shows(rt.local, stream) {
		con.Write(b)
	}
	rt.toLog(b)
	if len(b) > 0 && (rt.log != nil || rt.holding) {
		rt.midLine = b[len(b)-1] != '\n'
	}
}

// toLog writes b into the log file, or holds a copy for one to come.
func (rt *Route) toLog(b []byte) {
	switch {
	case rt.log != nil:
		if _, err := rt.log.Write(b); err != nil {
			rt.trouble.Warn(err)
		}
	case rt.holding && len(rt.held) < maxHeld:
		rt.held = append(rt.held, append([]byte(nil), b...))
	case rt.holding:
		rt.dropped++
	}
}

// endLine ends a raw log's last line before gotrain writes one of its own.
func (rt *Route) endLine() {
	if rt.midLine && rt.log != nil {
		_, _ = rt.log.Write([]byte{'\n'})
	}
	rt.midLine = false
}

// Become gives the route its rank and local rank: a new prefix, and log
// (when not nil), into which the held output is written first. The log file
// of its former rank, if any, is closed.
func (rt *Route) Become(rank, local int, log *os.File) {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if rt.log != nil && rt.log != log {
		// A survivor under a new rank: its old rank's file ends here.
		rt.endLine()
		fmt.Fprintf(rt.log, "=== gotrain: rank %d continues as rank %d\n", rt.rank, rank)
		_ = rt.log.Close()
	}
	rt.prefix, rt.rank, rt.local, rt.log = rankPrefix(rank), rank, local, log
	if rt.output.Mode == Raw {
		rt.prefix = ""
	}
	if log != nil {
		if rt.dropped > 0 {
			fmt.Fprintf(log, "=== gotrain: %d earlier piece(s) of the standby's output dropped\n", rt.dropped)
		}
		for _, l := range rt.held {
			_, _ = log.Write(l)
		}
	}
	rt.holding, rt.held, rt.dropped = false, nil, 0
}

// Close writes the log file's last line and closes it.
func (rt *Route) Close(exit supervise.Exit) {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if rt.log != nil {
		rt.endLine()
		fmt.Fprintf(rt.log, "=== gotrain: rank %d ended: %s\n", rt.rank, exit)
		_ = rt.log.Close()
		rt.log = nil
	}
	rt.holding, rt.held = false, nil
}

func rankPrefix(rank int) string { return fmt.Sprintf("[rank %d] ", rank) }

// NewRoute is the route of rank's worker (local: its local rank), printed
// as o says, into log (nil: none); trouble is told when log cannot be
// written.
func NewRoute(rank, local int, o Options, log *os.File, trouble *Trouble) *Route {
	rt := &Route{prefix: rankPrefix(rank), rank: rank, local: local, output: o, log: log, trouble: trouble}
	if o.Mode == Raw {
		rt.prefix = ""
	}
	return rt
}

// NewStandbyRoute is the route of the standby of slot: its lines carry
// "[standby N] " and, when hold, are held for the log file of the rank it
// becomes.
func NewStandbyRoute(slot int, o Options, hold bool, trouble *Trouble) *Route {
	rt := &Route{prefix: fmt.Sprintf("[standby %d] ", slot), rank: -1, local: slot, output: o, holding: hold, trouble: trouble}
	if o.Mode == Raw {
		rt.prefix = ""
	}
	return rt
}
