package supervise

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Spec is one process to start.
type Spec struct {
	// Path is the program: a path, or a name looked up in $PATH (os/exec).
	Path string
	// Args are the arguments after the program's name (argv[1:]).
	Args []string
	// Argv0 is the program's argv[0] as the user gave it ("": Path); a
	// relative path is also what is exec'd, when Dir is "".
	Argv0 string
	// Env is the environment; nil means this process's. Start adds TagEnv.
	Env []string
	// Dir is the working directory; "" means this process's.
	Dir string
	// Output takes stdout and stderr line by line; nil discards them. When
	// it is a SinkCloser, its Close is called before Done closes.
	Output LineSink
	// ExtraFiles are open files the process inherits as fd 3, 4, ...
	// (exec.Cmd.ExtraFiles); the caller closes its copies after Start.
	ExtraFiles []*os.File
	// Stdin, when not nil, is the process's stdin (nil: /dev/null). The
	// process then runs in a session of its own rather than only a group:
	// a process group that is not the terminal's foreground one would be
	// stopped (SIGTTIN) when it reads the terminal, while a process whose
	// session has no controlling terminal reads it like any file, and the
	// terminal's Ctrl-C still reaches the supervisor alone.
	Stdin *os.File
}

// TagEnv is the environment variable Start adds to each process: a tag
// unique to it, which its descendants inherit, so that a scan can tell
// whose orphan a process re-parented to the supervisor is (supervise.go).
const TagEnv = "GOTRAIN_SUPERVISE_TAG"

// Exit says how a process ended.
type Exit struct {
	Code   int            // exit status, or -1 when a signal ended it or Err is set
	Signal syscall.Signal // 0 unless a signal ended it
	// Early: the exit was read from /proc while the kernel was still tearing
	// the process down, before wait4 reaped it (procfs.go).
	Early bool
	Err   error // the process could not be waited for
}

// ExitCode returns the shell's convention: the status, or 128+signal.
func (e Exit) ExitCode() int {
	if e.Signal != 0 {
		return 128 + int(e.Signal)
	}
	return e.Code
}

func (e Exit) String() string {
	switch {
	case e.Err != nil:
		return fmt.Sprintf("wait failed: %v", e.Err)
	case e.Signal != 0:
		return fmt.Sprintf("killed by %s", unix.SignalName(e.Signal))
	}
	return fmt.Sprintf("exit status %d", e.Code)
}

// exitFromStatus turns what wait4 (or /proc) says into an Exit.
func exitFromStatus(ws unix.WaitStatus, err error) Exit {
	switch {
	case err != nil:
		return Exit{Code: -1, Err: err}
	case ws.Signaled():
		return Exit{Code: -1, Signal: ws.Signal()}
	}
	return Exit{Code: ws.ExitStatus()}
}

// Proc is a started process. Its process group id equals its pid.
type Proc struct {
	s    *Supervisor
	pid  int
	tag  string
	cmd  *exec.Cmd
	sink LineSink
	// pipes are the read ends of stdout and stderr; drain closes them when
	// processes outside the group keep them open.
	pipes [2]*os.File
	pumps sync.WaitGroup
	// exited closes once exit is set: when wait4 reaped the process, or
	// earlier, when its output closed while it was exiting. done closes once
	// it is reaped, its group killed, its output drained and its leftover
	// descendants killed.
	exited   chan struct{}
	done     chan struct{}
	exitOnce sync.Once
	exit     Exit
	// reaped is set once wait4 returned for the pid (exitEarly reads it).
	reaped atomic.Bool
	// ended (guarded by s.mu) is set once the process is reaped and its
	// group killed: whatever still descends from it is to be killed.
	ended bool
}

// Pid returns the process's pid, which is also its process group's id.
func (p *Proc) Pid() int { return p.pid }

// Exited is closed once the process's exit is known.
func (p *Proc) Exited() <-chan struct{} { return p.exited }

// Done is closed once the process is reaped, its group killed, its output
// drained (and the sink closed), and its leftover descendants killed.
func (p *Proc) Done() <-chan struct{} { return p.done }

// Exit waits for Exited and returns how the process ended.
func (p *Proc) Exit() Exit {
	<-p.exited
	return p.exit
}

// Signal sends sig to the process's whole group, unless it is Done (the
// group's id may name another group by then).
func (p *Proc) Signal(sig syscall.Signal) {
	select {
	case <-p.done:
	default:
		_ = unix.Kill(-p.pid, sig)
	}
}

// Stop sends sig (SIGTERM, usually) to the process group and SIGKILL after
// grace, and returns the exit once it is known: the process runs no more
// code of its own, though the kernel may still be tearing it down, and its
// descendants may linger until Done.
func (p *Proc) Stop(sig syscall.Signal, grace time.Duration) Exit {
	p.Signal(sig)
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-p.exited:
	case <-t.C:
		p.Signal(syscall.SIGKILL)
		<-p.exited
	}
	return p.exit
}

// withTag returns env (this process's when nil) with TagEnv set to tag.
func withTag(env []string, tag string) []string {
	if env == nil {
		env = os.Environ()
	}
	env = slices.DeleteFunc(slices.Clone(env), func(kv string) bool { return strings.HasPrefix(kv, TagEnv+"=") })
	return append(env, TagEnv+"="+tag)
}

// Start starts a process in its own process group with its output pumped
// into spec.Output, and watches it until Done. The error wraps os/exec's
// (exec.ErrNotFound, os.ErrNotExist, ...).
func (s *Supervisor) Start(spec Spec) (*Proc, error) {
	if spec.Path == "" {
		return nil, errors.New("supervise: start: empty Path")
	}
	cmd := exec.Command(spec.Path, spec.Args...)
	if spec.Argv0 != "" {
		cmd.Args[0] = spec.Argv0
		if strings.Contains(spec.Argv0, "/") && spec.Dir == "" {
			// Exec'd by the name given (the same file, from the same
			// directory): a #! script's interpreter gets the exec'd path as
			// the script's name ($0), not argv[0].
			cmd.Path = spec.Argv0
		}
	}
	cmd.Dir = spec.Dir
	cmd.ExtraFiles = spec.ExtraFiles
	if spec.Stdin != nil {
		cmd.Stdin = spec.Stdin
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{
		// Its own process group, so a signal reaches everything it started
		// (a new session is a new group too).
		Setpgid: spec.Stdin == nil,
		Setsid:  spec.Stdin != nil,
		// The kernel kills the process when the supervisor dies, even by
		// SIGKILL. PDEATHSIG fires when the *thread* that forked exits; the
		// Go runtime only ends threads whose goroutine locked them and
		// exited, which Start never does while forking.
		Pdeathsig: syscall.SIGKILL,
	}
	p := &Proc{s: s, cmd: cmd, sink: spec.Output, exited: make(chan struct{}), done: make(chan struct{})}
	if p.sink == nil {
		p.sink = discard{}
	}
	// Our own pipes rather than exec's: Proc reaps the process itself (see
	// wait) and closes the read ends once they are drained.
	outR, outW, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("supervise: start %s: %w", spec.Path, err)
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		_ = outR.Close()
		_ = outW.Close()
		return nil, fmt.Errorf("supervise: start %s: %w", spec.Path, err)
	}
	cmd.Stdout, cmd.Stderr = outW, errW

	s.mu.Lock()
	s.seq++
	p.tag = fmt.Sprintf("%s%d", s.tagPrefix, s.seq)
	// While a fork is under way the child is a stranger to the scans (no
	// pid in workers yet, this process's environment until it execs):
	// starting makes them leave strangers alone.
	s.starting++
	s.mu.Unlock()
	cmd.Env = withTag(spec.Env, p.tag)
	err = cmd.Start()
	_ = outW.Close()
	_ = errW.Close()
	s.mu.Lock()
	s.starting--
	if err == nil {
		p.pid = cmd.Process.Pid
		s.workers[p.pid] = p
		select {
		case s.started <- struct{}{}: // Run scans soon
		default:
		}
		s.byTag[p.tag] = p
	}
	s.mu.Unlock()
	if err != nil {
		_ = outR.Close()
		_ = errR.Close()
		return nil, fmt.Errorf("supervise: start %s: %w", spec.Path, err)
	}
	s.cfg.Reaper.addGroup(p.pid)
	p.pipes = [2]*os.File{outR, errR}
	p.pumps.Add(2)
	pumpFn := pump
	if _, ok := p.sink.(ChunkSink); ok {
		pumpFn = pumpChunks
	}
	go func() { defer p.pumps.Done(); defer outR.Close(); pumpFn(outR, Stdout, p.sink) }()
	go func() { defer p.pumps.Done(); defer errR.Close(); pumpFn(errR, Stderr, p.sink) }()
	go p.wait()
	return p, nil
}

// wait reaps the process and tidies up after it; it closes done last, after
// every other goroutine of the Proc has ended.
func (p *Proc) wait() {
	// Drain output first: lines still in the pipes would be lost. The pipes
	// reach EOF when every process holding them is gone, so a process's
	// children can keep the drain open: after the process itself exits they
	// get a grace period, then the group is killed.
	pumpsDone := make(chan struct{})
	go func() {
		p.pumps.Wait()
		p.exitEarly()
		close(pumpsDone)
	}()
	var ws unix.WaitStatus
	var err error
	for {
		// Wait4 on the pid alone leaves the pipes to the pumps, and the
		// statuses of other children to their owners.
		_, err = unix.Wait4(p.pid, &ws, 0, nil)
		if !errors.Is(err, unix.EINTR) {
			break
		}
	}
	p.reaped.Store(true)
	p.s.reaped(p)
	p.drain(pumpsDone)
	p.setExit(exitFromStatus(ws, err))
	// The group may hold processes the process started and left behind.
	_ = unix.Kill(-p.pid, unix.SIGKILL)
	p.s.cfg.Reaper.delGroup(p.pid)
	// And processes that left the group, now children of the supervisor.
	p.s.cleanup(p)
	_ = p.cmd.Process.Release()
	if c, ok := p.sink.(SinkCloser); ok {
		c.Close(p.exit)
	}
	close(p.done)
}

// setExit records how the process ended, the first time it is called, and
// closes exited.
func (p *Proc) setExit(e Exit) {
	p.exitOnce.Do(func() {
		p.exit = e
		close(p.exited)
	})
}

// exitEarly runs when both output pipes reached EOF: it records the exit if
// the process is exiting and wait4 has not reaped it yet (then the pid might
// already name another process).
func (p *Proc) exitEarly() {
	if p.reaped.Load() {
		return
	}
	ws, ok := exitingStatus(procStat(p.pid))
	if !ok || !allThreadsExiting(p.pid) || p.reaped.Load() {
		return
	}
	e := exitFromStatus(ws, nil)
	e.Early = true
	p.setExit(e)
}

// drain waits, after the process exited, until its output pipes reach EOF.
// Without descendants that is once the pumps read what is left in them:
// the kernel closed the process's ends before wait4 returned (pumpsFinish).
// Descendants in its group get DrainGrace, then the
// group is killed; pipes that stay open after that, or that only processes
// outside the group hold, are closed on them, so that a detached grandchild
// can neither delay the exit's report nor block it forever.
func (p *Proc) drain(pumpsDone <-chan struct{}) {
	if p.pumpsFinish(pumpsDone) {
		return
	}
	grace := p.s.cfg.DrainGrace
	orphansOnly := groupEmpty(p.pid)
	wait := grace
	if orphansOnly {
		wait = p.s.cfg.DrainOrphanWait
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-pumpsDone:
		return
	case <-t.C:
	}
	if p.pumpsFinish(pumpsDone) {
		return
	}
	if !orphansOnly {
		_ = unix.Kill(-p.pid, unix.SIGKILL)
		t.Reset(grace)
		select {
		case <-pumpsDone:
			return
		case <-t.C:
		}
		if p.pumpsFinish(pumpsDone) {
			return
		}
	}
	for _, f := range p.pipes {
		_ = f.Close() // the pumps' reads end
	}
	<-pumpsDone
}

// pumpsFinish says whether the pumps are done or will be by themselves,
// and then waits for them: once no process holds a pipe's write end, its
// pump reaches EOF after the lines left in it. Reading them may take long
// on a loaded machine (a process that exits after a burst leaves up to a
// pipe buffer full), and closing the pipe then would cut off the process's
// last lines; only pipes still held (by descendants) are closed on them.
func (p *Proc) pumpsFinish(pumpsDone <-chan struct{}) bool {
	select {
	case <-pumpsDone:
		return true
	default:
	}
	for _, f := range p.pipes {
		if !writersGone(f) {
			return false
		}
	}
	<-pumpsDone
	return true
}

// writersGone reports whether no process holds the write end of the pipe
// whose read end is r: poll says POLLHUP. A read end its pump closed
// counts as gone.
func writersGone(r *os.File) bool {
	rc, err := r.SyscallConn()
	if err != nil {
		return true
	}
	gone := true
	if err := rc.Control(func(fd uintptr) {
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		n, err := unix.Poll(fds, 0)
		gone = err == nil && n == 1 && fds[0].Revents&unix.POLLHUP != 0
	}); err != nil {
		return true // closed
	}
	return gone
}

// groupEmpty reports whether process group pgid has no process left.
func groupEmpty(pgid int) bool {
	return errors.Is(unix.Kill(-pgid, 0), unix.ESRCH)
}
