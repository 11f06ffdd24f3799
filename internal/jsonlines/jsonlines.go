// Package jsonlines turns a stream of text lines into one JSON object per
// line, for `gotrain launch --log-format json`: a log collector then reads
// every line gotrain writes, its own messages and its workers' output alike,
// as JSON.
//
// A line that already is a JSON object (a log/slog JSON record) passes
// through unchanged. Any other line becomes
//
//	{"time":"…","level":"INFO","msg":"…","host":"…","stream":"stderr"}
//
// with what its text says lifted into fields: "gotrain: warning: X" is level
// WARN and msg X; "gotrain: error: X" and "gotrain: job failed: X" are ERROR;
// "gotrain: X" is INFO with "source":"gotrain"; a worker's "[rank N] X" has
// "rank":N and "source":"worker". The keys time, level and msg are slog's.
package jsonlines

import (
	"bytes"
	"encoding/json"
	"io"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"
)

// MaxLine is the longest line kept whole; a longer one is cut into objects
// of at most this many bytes, so that one endless line cannot take all memory.
const MaxLine = 1 << 20

// Record is the object a plain line becomes.
type Record struct {
	Time   string `json:"time"`
	Level  string `json:"level"`
	Msg    string `json:"msg"`
	Host   string `json:"host,omitempty"`
	Stream string `json:"stream,omitempty"`
	Source string `json:"source,omitempty"`
	Rank   *int   `json:"rank,omitempty"`
	// Hint is what to do next, for an error that has one.
	Hint string `json:"hint,omitempty"`
	// ExitCode is gotrain's exit status, on the last line of a job that failed.
	ExitCode *int `json:"exit_code,omitempty"`
}

// Parse reads what line says into a Record (without time, host or stream).
func Parse(line string) Record {
	if rest, ok := strings.CutPrefix(line, "[rank "); ok {
		if n, text, ok := strings.Cut(rest, "] "); ok {
			if r, err := strconv.Atoi(n); err == nil && r >= 0 {
				return Record{Level: "INFO", Msg: text, Source: "worker", Rank: &r}
			}
		}
	}
	for _, p := range []string{"gotrain torchrun: ", "gotrain: "} {
		rest, ok := strings.CutPrefix(line, p)
		if !ok {
			continue
		}
		switch {
		case strings.HasPrefix(rest, "warning: "):
			return Record{Level: "WARN", Msg: strings.TrimPrefix(rest, "warning: "), Source: "gotrain"}
		case strings.HasPrefix(rest, "error: "):
			return Record{Level: "ERROR", Msg: strings.TrimPrefix(rest, "error: "), Source: "gotrain"}
		case strings.HasPrefix(rest, "debug: "):
			return Record{Level: "DEBUG", Msg: strings.TrimPrefix(rest, "debug: "), Source: "gotrain"}
		case strings.HasPrefix(rest, "job failed"):
			return Record{Level: "ERROR", Msg: rest, Source: "gotrain"}
		}
		return Record{Level: "INFO", Msg: rest, Source: "gotrain"}
	}
	return Record{Level: "INFO", Msg: line}
}

// Encode writes r as one JSON object and a newline.
func Encode(r Record) []byte {
	b, err := json.Marshal(r)
	if err != nil { // a Record of strings and ints always marshals
		b = []byte(`{"level":"ERROR","msg":` + strconv.Quote(err.Error()) + `}`)
	}
	return append(b, '\n')
}

// isObject says whether line is one JSON object already.
func isObject(line []byte) bool {
	t := bytes.TrimSpace(line)
	return len(t) > 1 && t[0] == '{' && t[len(t)-1] == '}' && json.Valid(t)
}

// Writer writes each line written to it as one JSON object to W. It is safe
// for concurrent use; a line split over several writes is joined first.
type Writer struct {
	w      io.Writer
	host   string
	stream string
	now    func() time.Time

	mu  sync.Mutex
	buf []byte
}

// NewWriter writes to w, marking each object with host and stream ("stdout"
// or "stderr"); now stamps the lines that have no time of their own.
func NewWriter(w io.Writer, host, stream string, now func() time.Time) *Writer {
	return &Writer{w: w, host: host, stream: stream, now: now}
}

func (w *Writer) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf = append(w.buf, p...)
	for {
		i := bytes.IndexByte(w.buf, '\n')
		if i < 0 && len(w.buf) < MaxLine {
			return len(p), nil
		}
		if i < 0 || i > MaxLine {
			i = cut(w.buf, MaxLine)
			if err := w.emit(w.buf[:i]); err != nil {
				return len(p), err
			}
			w.buf = w.buf[i:]
			continue
		}
		err := w.emit(w.buf[:i])
		w.buf = w.buf[i+1:]
		if err != nil {
			return len(p), err
		}
	}
}

// Flush writes a last line that has no newline.
func (w *Writer) Flush() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.buf) == 0 {
		return nil
	}
	err := w.emit(w.buf)
	w.buf = nil
	return err
}

// WriteRecord writes r, stamped as the lines are (for a message that is
// more than one line, such as a job's failure report).
func (w *Writer) WriteRecord(r Record) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.writeRecord(r)
}

func (w *Writer) emit(line []byte) error {
	line = bytes.TrimSuffix(line, []byte("\r"))
	if isObject(line) {
		_, err := w.w.Write(append(bytes.TrimSpace(line), '\n'))
		return err
	}
	return w.writeRecord(Parse(strings.ToValidUTF8(string(line), "\uFFFD")))
}

func (w *Writer) writeRecord(r Record) error {
	r.Time = w.now().Format(time.RFC3339Nano)
	if r.Host == "" {
		r.Host = w.host
	}
	if r.Stream == "" {
		r.Stream = w.stream
	}
	_, err := w.w.Write(Encode(r))
	return err
}

// cut is where to cut b at most n bytes in, not inside a UTF-8 character.
func cut(b []byte, n int) int {
	if len(b) <= n {
		return len(b)
	}
	for i := n; i > n-utf8.UTFMax && i > 0; i-- {
		if utf8.RuneStart(b[i]) {
			return i
		}
	}
	return n
}
