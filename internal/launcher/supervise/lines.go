package supervise

import (
	"bufio"
	"io"
)

// Stream names one of a process's two output streams.
type Stream int

const (
	Stdout Stream = 1
	Stderr Stream = 2
)

func (s Stream) String() string {
	switch s {
	case Stdout:
		return "stdout"
	case Stderr:
		return "stderr"
	}
	return "stream?"
}

// LineSink takes a process's output, one whole line at a time, without its
// newline. The two streams are pumped by two goroutines, so Line must be safe
// for concurrent calls; line is only valid during the call.
type LineSink interface {
	Line(stream Stream, line []byte)
}

// SinkCloser is a LineSink that wants to know when the output is over: Close
// is called once, after the last line and with the process's exit, before
// the Proc's Done channel closes (the launcher ends a rank's log file there).
type SinkCloser interface {
	LineSink
	Close(Exit)
}

// ChunkSink is a LineSink that takes output as it was read, its bytes
// unchanged (no line is split, joined or given a newline): a raw console
// that must stay byte-exact. Start hands such a sink chunks, never lines.
type ChunkSink interface {
	LineSink
	// Chunk takes the next bytes of a stream; b is only valid during the
	// call. Both streams' pumps call it concurrently.
	Chunk(stream Stream, b []byte)
}

// LineFunc adapts a function to LineSink.
type LineFunc func(stream Stream, line []byte)

func (f LineFunc) Line(stream Stream, line []byte) { f(stream, line) }

var _ LineSink = LineFunc(nil)

// discard is the sink of a Spec without one.
type discard struct{}

func (discard) Line(Stream, []byte) {}

// MaxLine bounds one line of output; longer lines are split into pieces of
// MaxLine bytes.
const MaxLine = 1 << 20

// pumpChunks feeds r to sink (a ChunkSink) as read, until EOF.
func pumpChunks(r io.Reader, stream Stream, sink LineSink) {
	cs := sink.(ChunkSink)
	buf := make([]byte, 64<<10)
	for {
		n, err := r.Read(buf)
		if n > 0 {
			cs.Chunk(stream, buf[:n])
		}
		if err != nil {
			return
		}
	}
}

// pump feeds r to sink line by line. A last line without a newline is still
// a line. It returns when r reaches EOF (or fails), that is when the process
// and every process sharing its output have exited, or the pipe was closed.
func pump(r io.Reader, stream Stream, sink LineSink) {
	br := bufio.NewReaderSize(r, 64<<10)
	var partial []byte
	emit := func() {
		sink.Line(stream, partial)
		partial = partial[:0]
	}
	for {
		chunk, isPrefix, err := br.ReadLine()
		if len(chunk) > 0 || (err == nil && !isPrefix) {
			partial = append(partial, chunk...)
			if !isPrefix || len(partial) >= MaxLine {
				emit()
			}
		}
		if err != nil {
			if len(partial) > 0 {
				emit()
			}
			return
		}
	}
}
