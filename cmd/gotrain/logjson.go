package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gotrain/gotrain/internal/jsonlines"
)

// With --log-format json every line gotrain launch writes is one JSON
// object: its log records (slog's JSON handler), its plain messages (restart
// lines, verdicts, warnings, the join progress), its workers' output, and
// the last line, the job's failure. The plain lines come from many places
// (the launcher, Slurm and pod set-up, the workers' relay), so rather than
// thread a writer through each, os.Stdout and os.Stderr become pipes whose
// lines internal/jsonlines wraps on their way to the real streams.

// jsonConsoleOn says that os.Stdout and os.Stderr are wrapped already.
var jsonConsoleOn atomic.Bool

// reportedError is a command's failure already written on stderr (as a JSON
// object); cli.go prints nothing more and exits with its code.
type reportedError struct{ code int }

func (reportedError) Error() string   { return "" }
func (e reportedError) ExitCode() int { return e.code }

// jsonConsole starts wrapping os.Stdout's and os.Stderr's lines. end writes
// the command's error, if any, as the last object, drains the pipes, puts
// the streams back, and returns the error for cli.go.
func jsonConsole(host string) (end func(error) error, err error) {
	if !jsonConsoleOn.CompareAndSwap(false, true) { // gotrain torchrun's, which runs launch within
		return func(err error) error { return err }, nil
	}
	type stream struct {
		real *os.File
		pipe *os.File
		w    *jsonlines.Writer
		done chan struct{}
	}
	var streams []*stream
	for _, s := range []struct {
		name string
		f    **os.File
	}{{"stdout", &os.Stdout}, {"stderr", &os.Stderr}} {
		r, w, err := os.Pipe()
		if err != nil {
			for _, st := range streams {
				st.pipe.Close()
			}
			return nil, fmt.Errorf("--log-format json: %w", err)
		}
		st := &stream{real: *s.f, pipe: w, w: jsonlines.NewWriter(*s.f, host, s.name, time.Now), done: make(chan struct{})}
		go func() {
			defer close(st.done)
			defer r.Close()
			_, _ = io.Copy(st.w, r)
			_ = st.w.Flush()
		}()
		*s.f = w
		streams = append(streams, st)
	}
	var once sync.Once
	return func(cmdErr error) error {
		once.Do(func() {
			out, errs := streams[0], streams[1]
			if cmdErr != nil && !errors.Is(cmdErr, flag.ErrHelp) {
				code := exitFailure
				var ec exitCoder
				if errors.As(cmdErr, &ec) {
					code = ec.ExitCode()
				}
				rec := jsonlines.Record{Level: "ERROR", Msg: strings.TrimPrefix(cmdErr.Error(), "gotrain: "), Source: "gotrain", ExitCode: &code}
				var ue *usageError
				if errors.As(cmdErr, &ue) {
					code = exitUsage
					rec.Msg, rec.Hint = ue.msg, ue.hint
				}
				if rec.Msg != "" { // "": the command's output said it
					// After the pipes drain, so that it is the last line.
					defer func() { _ = errs.w.WriteRecord(rec) }()
				}
				cmdErr = reportedError{code}
			}
			os.Stdout, os.Stderr = out.real, errs.real
			jsonConsoleOn.Store(false)
			for _, st := range streams {
				st.pipe.Close()
				// A child that inherited the pipe may hold it open: its
				// lines after gotrain's end are not waited for.
				select {
				case <-st.done:
				case <-time.After(5 * time.Second):
				}
			}
		})
		return cmdErr
	}, nil
}
