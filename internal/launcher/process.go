package launcher

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/gotrain/gotrain/internal/launcher/observe"
	"github.com/gotrain/gotrain/internal/launcher/output"
	"github.com/gotrain/gotrain/internal/launcher/pystandby"
	"github.com/gotrain/gotrain/internal/launcher/relay"
	"github.com/gotrain/gotrain/internal/launcher/supervise"
)

// A rank's process, as the agent sees it: the supervised process (package
// internal/launcher/supervise starts it in its own group, reaps it, drains its
// output and kills what it leaves behind) plus what makes it a rank's or a
// standby's: its output's prefix and log file, its last stderr lines and
// the node's state when it started.

// workerSpec is one worker process to start.
type workerSpec struct {
	rank       int
	local      int // local rank (a standby: its slot)
	generation int64
	program    string
	args       []string
	env        []string
	logDir     string // "" for no log file
	// logTrouble warns once when a log file cannot be opened or written.
	logTrouble *output.Trouble
	// standby: a hot standby for local slot `slot` (relay/standby.go): no rank
	// yet, its output under "[standby N] ", no log file until it has a rank.
	standby bool
	slot    int
	// extra are files the process inherits as fd 3, ... (a Python
	// standby's socket: internal/launcher/pystandby).
	extra []*os.File
	// output says how the output is printed (internal/launcher/output); stdin, when not
	// nil, is the process's stdin (one rank alone reads gotrain's).
	output output.Options
	stdin  *os.File
	argv0  string // "": program
}

// workerProc is a running worker or standby.
type workerProc struct {
	spec workerSpec // as it was started
	// who is what the process is now, gpu the GPU whose CPUs it is pinned
	// to (-1: none); only the registry's lifecycle steps set them
	// (registry.go).
	who    relay.Proc
	gpu    int
	proc   *supervise.Proc
	stderr *output.Tail
	out    *output.Route // prefix and log file of its output (output/lines.go)
	// evidence is the node's state at the start, for the root-cause report.
	evidence observe.Evidence
	// py is a Python standby's socket until it is handed a rank
	// (internal/launcher/pystandby); nil for any other process.
	py *pystandby.Link
}

// stderrTailLines is how many of a worker's last stderr lines a failure
// report carries.
const stderrTailLines = 20

// startWorker starts a worker under sup with its output prefixed on stdout
// and stderr and, with a log dir, copied into rankN.log there.
func startWorker(sup *supervise.Supervisor, spec workerSpec, stdout, stderr *output.Console) (*workerProc, error) {
	p := &workerProc{spec: spec, stderr: output.NewTail(stderrTailLines)}
	if spec.standby {
		p.out = output.NewStandbyRoute(spec.slot, spec.output, spec.logDir != "", spec.logTrouble)
	} else {
		var f *os.File
		if spec.logDir != "" {
			// A log dir that is gone (or full) costs the log file, never the rank.
			var err error
			if f, err = openRankLog(spec.logDir, spec.rank, spec.generation, ""); err != nil {
				spec.logTrouble.Warn(err)
			}
		}
		p.out = output.NewRoute(spec.rank, spec.local, spec.output, f, spec.logTrouble)
	}
	var sink supervise.LineSink = &workerSink{stdout: stdout, stderr: stderr, route: p.out, tail: p.stderr}
	if spec.output.Mode == output.Raw {
		sink = &rawWorkerSink{workerSink: sink.(*workerSink)}
	}
	proc, err := sup.Start(supervise.Spec{Path: spec.program, Args: spec.args, Env: spec.env,
		Output: sink, ExtraFiles: spec.extra, Stdin: spec.stdin, Argv0: spec.argv0})
	if err != nil {
		p.out.Close(supervise.Exit{Code: -1, Err: err})
		if errors.Is(err, exec.ErrNotFound) || errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("start rank %d: %w (check the program path after `--`)", spec.rank, err)
		}
		if errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE) {
			return nil, fmt.Errorf("start rank %d: %w (raise the open-files limit: ulimit -n)", spec.rank, err)
		}
		return nil, fmt.Errorf("start rank %d: %w", spec.rank, err)
	}
	p.proc = proc
	return p, nil
}

// workerSink takes a worker's lines: onto the console under its route's
// prefix and into its log file, and its stderr lines into its tail too.
type workerSink struct {
	stdout, stderr *output.Console
	route          *output.Route
	tail           *output.Tail
}

var _ supervise.SinkCloser = (*workerSink)(nil)

func (s *workerSink) Line(stream supervise.Stream, line []byte) {
	if stream == supervise.Stderr {
		s.route.Line(s.stderr, stream, line)
		s.tail.Add(string(line))
		return
	}
	s.route.Line(s.stdout, stream, line)
}

// rawWorkerSink takes a worker's output as written (output.Raw): onto the
// console and into its log file unchanged; its stderr is still cut into
// lines for its tail.
type rawWorkerSink struct {
	*workerSink
	mu      sync.Mutex
	partial []byte // stderr after its last newline
}

var _ supervise.ChunkSink = (*rawWorkerSink)(nil)

func (s *rawWorkerSink) Chunk(stream supervise.Stream, b []byte) {
	if stream == supervise.Stdout {
		s.route.Chunk(s.stdout, stream, b)
		return
	}
	s.route.Chunk(s.stderr, stream, b)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.partial = append(s.partial, b...)
	for {
		i := bytes.IndexByte(s.partial, '\n')
		if i < 0 {
			break
		}
		s.tail.Add(string(s.partial[:i]))
		s.partial = s.partial[i+1:]
	}
	if len(s.partial) > supervise.MaxLine {
		s.tail.Add(string(s.partial))
		s.partial = nil
	}
}

// Close adds a last stderr line without its newline to the tail, and ends
// the log file.
func (s *rawWorkerSink) Close(e supervise.Exit) {
	s.mu.Lock()
	if len(s.partial) > 0 {
		s.tail.Add(string(s.partial))
		s.partial = nil
	}
	s.mu.Unlock()
	s.workerSink.Close(e)
}

// Close ends the log file with how the worker ended.
func (s *workerSink) Close(e supervise.Exit) { s.route.Close(e) }

// openRankLog opens (appending, never through a symbolic link: output/logdir.go)
// rank's log file in dir and writes the generation's header line; note,
// when not empty, ends the header.
func openRankLog(dir string, rank int, generation int64, note string) (*os.File, error) {
	f, err := output.OpenLogFile(filepath.Join(dir, fmt.Sprintf("rank%d.log", rank)))
	if err != nil {
		return nil, fmt.Errorf("open rank %d's log file: %w", rank, err)
	}
	if note != "" {
		note = " " + note
	}
	fmt.Fprintf(f, "=== gotrain: rank %d, generation %d, started %s%s\n", rank, generation, time.Now().Format(time.RFC3339), note)
	return f, nil
}

func (p *workerProc) pid() int { return p.proc.Pid() }

// exited is closed once the worker's exit is known; done once it is reaped
// and nothing it started is left.
func (p *workerProc) exited() <-chan struct{} { return p.proc.Exited() }
func (p *workerProc) done() <-chan struct{}   { return p.proc.Done() }

// exit is how the worker ended; only once exited is closed.
func (p *workerProc) exit() supervise.Exit { return p.proc.Exit() }

// signal sends sig to the worker's whole process group.
func (p *workerProc) signal(sig syscall.Signal) { p.proc.Signal(sig) }

// RunReaper is the orphan reaper process's body (`gotrain launch _reaper`):
// see supervise.RunReaper.
func RunReaper(in io.Reader) error { return supervise.RunReaper(in) }
