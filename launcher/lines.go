package launcher

import (
	"fmt"
	"io"
	"os"
	"sync"

	"github.com/gotrain/gotrain/launcher/supervise"
)

// console serialises whole lines from many workers onto one writer, so that
// output of concurrent ranks never interleaves within a line.
type console struct {
	mu sync.Mutex
	w  io.Writer
}

func (c *console) writeLine(prefix string, line []byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	_, _ = io.WriteString(c.w, prefix)
	_, _ = c.w.Write(line)
	_, _ = io.WriteString(c.w, "\n")
}

// tail keeps the last n lines written to it.
type tail struct {
	mu    sync.Mutex
	n     int
	lines []string
}

func newTail(n int) *tail { return &tail{n: n} }

func (t *tail) add(line string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.lines) == t.n {
		copy(t.lines, t.lines[1:])
		t.lines = t.lines[:t.n-1]
	}
	t.lines = append(t.lines, line)
}

func (t *tail) snapshot() []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return append([]string(nil), t.lines...)
}

// route is where one worker's lines go: the console under a prefix, and its
// log file. Both of a worker's pumps share it. A standby's route changes when
// it becomes a rank (standby.go): until then its lines carry "[standby N] "
// and are held for the rank's log file, which it gets then.
type route struct {
	mu      sync.Mutex
	prefix  string
	rank    int      // for the log file's last line
	log     *os.File // nil: no log file (yet)
	holding bool     // keep lines for a log file to come
	held    [][]byte
	dropped int // held lines dropped beyond maxHeld
	// trouble is told when the log file cannot be written (a full disk).
	trouble *logTrouble
}

// maxHeld bounds the lines a standby holds for its log file.
const maxHeld = 1000

func (rt *route) line(con *console, b []byte) {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	con.writeLine(rt.prefix, b)
	switch {
	case rt.log != nil:
		if _, err := rt.log.Write(append(b[:len(b):len(b)], '\n')); err != nil {
			rt.trouble.warn(err)
		}
	case rt.holding && len(rt.held) < maxHeld:
		rt.held = append(rt.held, append([]byte(nil), b...))
	case rt.holding:
		rt.dropped++
	}
}

// become gives the route its rank: a new prefix, and log (when not nil),
// into which the held lines are written first. The log file of its former
// rank, if any, is closed.
func (rt *route) become(rank int, log *os.File) {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if rt.log != nil && rt.log != log {
		// A survivor under a new rank: its old rank's file ends here.
		fmt.Fprintf(rt.log, "=== gotrain: rank %d continues as rank %d\n", rt.rank, rank)
		_ = rt.log.Close()
	}
	rt.prefix, rt.rank, rt.log = rankPrefix(rank), rank, log
	if log != nil {
		if rt.dropped > 0 {
			fmt.Fprintf(log, "=== gotrain: %d earlier line(s) of the standby dropped\n", rt.dropped)
		}
		for _, l := range rt.held {
			_, _ = log.Write(l)
			_, _ = log.Write([]byte{'\n'})
		}
	}
	rt.holding, rt.held, rt.dropped = false, nil, 0
}

// close writes the log file's last line and closes it.
func (rt *route) close(exit supervise.Exit) {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if rt.log != nil {
		fmt.Fprintf(rt.log, "=== gotrain: rank %d ended: %s\n", rt.rank, exit)
		_ = rt.log.Close()
		rt.log = nil
	}
	rt.holding, rt.held = false, nil
}

func rankPrefix(rank int) string { return fmt.Sprintf("[rank %d] ", rank) }
