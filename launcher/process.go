package launcher

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// workerSpec is one worker process to start.
type workerSpec struct {
	rank       int
	generation int64
	program    string
	args       []string
	env        []string
	logDir     string // "" for no log file
	// standby: a hot standby for local slot `slot` (standby.go): no rank
	// yet, its output under "[standby N] ", no log file until it has a rank.
	standby bool
	slot    int
	// reaper is told about the worker's process group (reaper.go); may be nil.
	reaper *reaper
}

// workerProc is a running worker. Its process group id equals its pid.
type workerProc struct {
	spec   workerSpec
	cmd    *exec.Cmd
	stderr *tail
	out    *route // prefix and log file of its output (lines.go)
	pumps  sync.WaitGroup
	// exited is closed once exit is set: when wait4 reaped the worker, or
	// earlier, when its output closed while it was exiting (exitearly.go).
	// done is closed once it is reaped and its group killed.
	exited   chan struct{}
	done     chan struct{}
	exitOnce sync.Once
	exit     exitInfo
	early    bool // exit came from /proc before wait4
	// evidence is the node's state at the start, for the root-cause report.
	evidence evidence
	// pidNum is the worker's pid, kept because Process.Release forgets it.
	pidNum int
	// pipes are the read ends of stdout and stderr; wait closes them when
	// a process outside the worker's group keeps them open.
	pipes [2]*os.File
	// reaped is set once wait4 returned for the pid (exitearly.go reads it).
	reaped atomic.Bool
}

// drainGrace is how long the worker's descendants get to close its output
// pipes after it exited, before its process group is killed; and how long
// the pipes then get before they are closed on whatever still holds them.
// drainOrphanWait is the wait when the group is already empty, so that only
// processes that left it (setsid) hold the pipes: killing the group would
// not reach them, and nothing the worker owns is left to wait for.
const (
	drainGrace      = 2 * time.Second
	drainOrphanWait = 100 * time.Millisecond
)

// exitInfo says how a worker ended.
type exitInfo struct {
	code   int            // exit status, or -1 when a signal ended it
	signal syscall.Signal // 0 unless a signal ended it
	err    error          // the process could not be waited for
}

// ExitCode returns the shell's convention: the status, or 128+signal.
func (e exitInfo) ExitCode() int {
	if e.signal != 0 {
		return 128 + int(e.signal)
	}
	return e.code
}

func (e exitInfo) String() string {
	if e.signal != 0 {
		return fmt.Sprintf("killed by %s", unix.SignalName(e.signal))
	}
	return fmt.Sprintf("exit status %d", e.code)
}

// stderrTailLines is how many of a worker's last stderr lines a failure
// report carries.
const stderrTailLines = 20

// startWorker starts a worker with its output prefixed on con and, with a log
// dir, copied into rank-N.log there.
func startWorker(spec workerSpec, stdout, stderr *console) (*workerProc, error) {
	cmd := exec.Command(spec.program, spec.args...)
	cmd.Env = spec.env
	cmd.SysProcAttr = &syscall.SysProcAttr{
		// Its own process group, so a signal reaches everything it started.
		Setpgid: true,
		// The kernel kills the worker when the agent dies, even by SIGKILL.
		// PDEATHSIG fires when the *thread* that forked exits; the Go runtime
		// only ends threads whose goroutine locked them and exited, which the
		// agent never does while forking.
		Pdeathsig: syscall.SIGKILL,
	}
	p := &workerProc{spec: spec, cmd: cmd, stderr: newTail(stderrTailLines), exited: make(chan struct{}), done: make(chan struct{}),
		out: &route{prefix: rankPrefix(spec.rank), rank: spec.rank}}
	if spec.standby {
		p.out = &route{prefix: fmt.Sprintf("[standby %d] ", spec.slot), rank: -1, holding: spec.logDir != ""}
	} else if spec.logDir != "" {
		f, err := openRankLog(spec.logDir, spec.rank, spec.generation, "")
		if err != nil {
			return nil, err
		}
		p.out.log = f
	}
	// Our own pipes rather than exec's: the agent reaps the worker itself
	// (see wait) and closes the read ends once they are drained.
	outR, outW, err := os.Pipe()
	if err != nil {
		p.closeLog()
		return nil, err
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		_ = outR.Close()
		_ = outW.Close()
		p.closeLog()
		return nil, err
	}
	cmd.Stdout, cmd.Stderr = outW, errW
	err = cmd.Start()
	_ = outW.Close()
	_ = errW.Close()
	if err != nil {
		_ = outR.Close()
		_ = errR.Close()
		p.closeLog()
		if errors.Is(err, exec.ErrNotFound) || errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("start rank %d: %w (check the program path after `--`)", spec.rank, err)
		}
		return nil, fmt.Errorf("start rank %d: %w", spec.rank, err)
	}
	p.pidNum = cmd.Process.Pid
	spec.reaper.add(p.pidNum)
	p.pipes = [2]*os.File{outR, errR}
	p.pumps.Add(2)
	go func() { defer p.pumps.Done(); defer outR.Close(); pump(outR, stdout, p.out, nil) }()
	go func() { defer p.pumps.Done(); defer errR.Close(); pump(errR, stderr, p.out, p.stderr) }()
	go p.wait()
	return p, nil
}

func (p *workerProc) wait() {
	// Drain output first: exec.Cmd.Wait closes the pipes, and lines still in
	// them would be lost. The pipes reach EOF when every process holding them
	// is gone, so a worker's children can keep the drain open: after the
	// worker itself exits they get a grace period, then the group is killed.
	pumpsDone := make(chan struct{})
	go func() {
		p.pumps.Wait()
		close(pumpsDone)
		p.exitEarly() // exitearly.go
	}()
	var ws unix.WaitStatus
	var err error
	for {
		// Wait4 on the pid alone leaves the pipes to the pumps.
		_, err = unix.Wait4(p.pidNum, &ws, 0, nil)
		if !errors.Is(err, unix.EINTR) {
			break
		}
	}
	p.reaped.Store(true)
	p.drain(pumpsDone)
	p.setExit(exitFromStatus(ws, err), false)
	// The group may hold processes the worker started and left behind.
	_ = unix.Kill(-p.pidNum, unix.SIGKILL)
	p.spec.reaper.del(p.pidNum)
	p.closeLog()
	_ = p.cmd.Process.Release()
	close(p.done)
}

// exitFromStatus turns what wait4 (or /proc) says into an exitInfo.
func exitFromStatus(ws unix.WaitStatus, err error) exitInfo {
	switch {
	case err != nil:
		return exitInfo{code: -1, err: err}
	case ws.Signaled():
		return exitInfo{code: -1, signal: ws.Signal()}
	}
	return exitInfo{code: ws.ExitStatus()}
}

// setExit records how the worker ended, the first time it is called, and
// closes exited.
func (p *workerProc) setExit(e exitInfo, early bool) {
	p.exitOnce.Do(func() {
		p.exit, p.early = e, early
		close(p.exited)
	})
}

// drain waits, after the worker exited, until its output pipes reach EOF.
// Without descendants that is at once: the kernel closed the worker's ends
// before wait4 returned. Descendants in its group get drainGrace, then the
// group is killed; pipes that stay open after that, or that only processes
// outside the group hold, are closed on them, so that a detached grandchild
// can neither delay the exit's report nor block it forever.
func (p *workerProc) drain(pumpsDone <-chan struct{}) {
	select {
	case <-pumpsDone:
		return
	default:
	}
	wait := drainGrace
	if groupEmpty(p.pidNum) {
		wait = drainOrphanWait
	}
	select {
	case <-pumpsDone:
		return
	case <-time.After(wait):
	}
	if wait == drainGrace {
		_ = unix.Kill(-p.pidNum, unix.SIGKILL)
		select {
		case <-pumpsDone:
			return
		case <-time.After(drainGrace):
		}
	}
	for _, f := range p.pipes {
		if f != nil {
			_ = f.Close() // the pumps' reads end
		}
	}
	<-pumpsDone
}

// groupEmpty reports whether process group pgid has no process left.
func groupEmpty(pgid int) bool {
	return errors.Is(unix.Kill(-pgid, 0), unix.ESRCH)
}

func (p *workerProc) closeLog() { p.out.close(p.exit) }

// openRankLog opens (appending) rank's log file in dir and writes the
// generation's header line; note, when not empty, ends the header.
func openRankLog(dir string, rank int, generation int64, note string) (*os.File, error) {
	f, err := os.OpenFile(filepath.Join(dir, fmt.Sprintf("rank%d.log", rank)), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open rank %d's log file: %w", rank, err)
	}
	if note != "" {
		note = " " + note
	}
	fmt.Fprintf(f, "=== gotrain: rank %d, generation %d, started %s%s\n", rank, generation, time.Now().Format(time.RFC3339), note)
	return f, nil
}

func (p *workerProc) pid() int { return p.pidNum }

// signal sends sig to the worker's whole process group.
func (p *workerProc) signal(sig syscall.Signal) {
	select {
	case <-p.done:
	default:
		_ = unix.Kill(-p.pid(), sig)
	}
}

// stop asks the worker to end with SIGTERM and kills its group with SIGKILL
// after grace. It returns once the worker has exited (its exit is known: it
// runs no more code of its own, though the kernel may still be tearing it
// down; done says when it is gone).
func (p *workerProc) stop(sig syscall.Signal, grace time.Duration) {
	p.signal(sig)
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-p.exited:
	case <-t.C:
		p.signal(syscall.SIGKILL)
		<-p.exited
	}
}
