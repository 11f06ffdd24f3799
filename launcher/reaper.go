package launcher

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// The reaper closes the one gap PR_SET_PDEATHSIG leaves: when the agent is
// SIGKILLed, the kernel kills each worker, but not the processes a worker
// started, which would be reparented to init and live on. The reaper is a
// small child process (`gotrain _reaper`) that holds the read end of a pipe
// from the agent; the agent writes "add PGID" and "del PGID" lines as worker
// process groups come and go. When the agent dies — however it dies — the
// kernel closes the write end, the reaper reads EOF, SIGKILLs every process
// group still listed, and exits. No polling, no timers: a pipe's EOF is the
// most reliable death notice Linux gives to a non-child.

// reaper is the agent's side: the pipe to the reaper process.
type reaper struct {
	mu  sync.Mutex
	w   io.WriteCloser
	cmd *exec.Cmd
}

// startReaper starts command (e.g. [gotrain, _reaper]); nil command, or one
// that cannot start, gives a nil *reaper, whose methods do nothing: the
// workers are still covered by PDEATHSIG.
func startReaper(command []string) (*reaper, error) {
	if len(command) == 0 {
		return nil, nil
	}
	cmd := exec.Command(command[0], command[1:]...)
	// Its own process group: a Ctrl-C meant for the agent's group must not
	// take the reaper down before the agent has stopped its workers.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Stderr = os.Stderr
	w, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start the orphan reaper %s: %w", command[0], err)
	}
	return &reaper{w: w, cmd: cmd}, nil
}

func (r *reaper) send(verb string, pgid int) {
	if r == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	fmt.Fprintf(r.w, "%s %d\n", verb, pgid)
}

// add tells the reaper about a new worker process group.
func (r *reaper) add(pgid int) { r.send("add", pgid) }

// del tells the reaper a group is gone, so that its id, once reused by
// another process group, is never killed.
func (r *reaper) del(pgid int) { r.send("del", pgid) }

// close ends the reaper after a clean shutdown (every group already gone)
// and waits for it.
func (r *reaper) close() {
	if r == nil {
		return
	}
	r.mu.Lock()
	_ = r.w.Close()
	r.mu.Unlock()
	_ = r.cmd.Wait()
}

// RunReaper is the reaper process's body: it reads add/del lines from in
// until EOF, then SIGKILLs every process group still listed. It ignores
// SIGINT, SIGTERM and SIGHUP, which are meant for the agent: the agent's
// death, seen as EOF, is its only cue.
func RunReaper(in io.Reader) error {
	signal.Ignore(syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	groups := map[int]bool{}
	sc := bufio.NewScanner(in)
	for sc.Scan() {
		verb, arg, ok := strings.Cut(sc.Text(), " ")
		pgid, err := strconv.Atoi(arg)
		if !ok || err != nil || pgid <= 1 {
			continue // never signal group 0, 1 or garbage
		}
		switch verb {
		case "add":
			groups[pgid] = true
		case "del":
			delete(groups, pgid)
		}
	}
	for pgid := range groups {
		_ = unix.Kill(-pgid, unix.SIGKILL)
	}
	return nil
}
