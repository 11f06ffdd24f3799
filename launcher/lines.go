package launcher

import (
	"bufio"
	"io"
	"sync"
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

// maxLine bounds one line of worker output; longer lines are split.
const maxLine = 1 << 20

// pump copies r to the console line by line with prefix, and to logFile (when
// not nil) unprefixed, remembering lines in t (when not nil). It returns when
// r reaches EOF, that is when the worker and every process sharing its
// output have exited.
func pump(r io.Reader, prefix string, con *console, logFile *syncWriter, t *tail) {
	br := bufio.NewReaderSize(r, 64<<10)
	var partial []byte
	for {
		chunk, isPrefix, err := br.ReadLine()
		if len(chunk) > 0 || (err == nil && !isPrefix) {
			partial = append(partial, chunk...)
			if !isPrefix || len(partial) >= maxLine {
				con.writeLine(prefix, partial)
				if logFile != nil {
					logFile.writeLine(partial)
				}
				if t != nil {
					t.add(string(partial))
				}
				partial = partial[:0]
			}
		}
		if err != nil {
			if len(partial) > 0 {
				con.writeLine(prefix, partial)
				if logFile != nil {
					logFile.writeLine(partial)
				}
				if t != nil {
					t.add(string(partial))
				}
			}
			return
		}
	}
}

// syncWriter is a log file shared by a worker's stdout and stderr pumps.
type syncWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (s *syncWriter) writeLine(line []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, _ = s.w.Write(line)
	_, _ = s.w.Write([]byte{'\n'})
}
