package supervise

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
	"time"

	"golang.org/x/sys/unix"
)

// The reaper closes the gap PR_SET_PDEATHSIG leaves: when the supervising
// process is SIGKILLed, the kernel kills each process it started, but not
// what those started, which would be re-parented to init and live on. The
// reaper is a small child process (`gotrain launch _reaper`) that holds the
// read end of a pipe from the supervisor, which writes lines as processes
// come and go:
//
//	add PGID            a process group to kill
//	del PGID            forget it (its id may be reused)
//	addpid PID START    a single process (outside every listed group) to
//	                    kill, if it still started at START (/proc/PID/stat
//	                    field 22), so that a reused pid is never killed
//	delpid PID          forget it
//
// When the supervisor dies — however it dies — the kernel closes the write
// end, the reaper reads EOF, SIGKILLs every group and process still listed
// and their descendants, and exits. No polling while the supervisor lives: a
// pipe's EOF is the most reliable death notice Linux gives to a non-child.
// Older reapers skip the addpid/delpid lines (their pid does not parse), so
// the protocol stays compatible both ways.

// Reaper is the supervisor's side: the pipe to the reaper process. A nil
// *Reaper is valid and does nothing.
type Reaper struct {
	mu  sync.Mutex
	w   io.WriteCloser
	cmd *exec.Cmd
}

// StartReaper starts command (e.g. [gotrain, launch, _reaper]), which must
// run RunReaper on its stdin. An empty command gives a nil *Reaper.
func StartReaper(command []string) (*Reaper, error) {
	if len(command) == 0 {
		return nil, nil
	}
	cmd := exec.Command(command[0], command[1:]...)
	// Its own process group: a Ctrl-C meant for the supervisor's group must
	// not take the reaper down before the supervisor has stopped its
	// processes.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Stderr = os.Stderr
	w, err := cmd.StdinPipe()
	if err != nil {
		return nil, fmt.Errorf("start the orphan reaper: %w", err)
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start the orphan reaper %s: %w", command[0], err)
	}
	return &Reaper{w: w, cmd: cmd}, nil
}

// Pid returns the reaper process's pid (0 for a nil Reaper).
func (r *Reaper) Pid() int {
	if r == nil {
		return 0
	}
	return r.cmd.Process.Pid
}

func (r *Reaper) send(line string) {
	if r == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	_, _ = io.WriteString(r.w, line+"\n")
}

func (r *Reaper) addGroup(pgid int)            { r.send(fmt.Sprintf("add %d", pgid)) }
func (r *Reaper) delGroup(pgid int)            { r.send(fmt.Sprintf("del %d", pgid)) }
func (r *Reaper) addPid(pid int, start uint64) { r.send(fmt.Sprintf("addpid %d %d", pid, start)) }
func (r *Reaper) delPid(pid int)               { r.send(fmt.Sprintf("delpid %d", pid)) }

// Close ends the reaper after a clean shutdown (every process already gone)
// and waits for it. Call it after every Proc is Done.
func (r *Reaper) Close() error {
	if r == nil {
		return nil
	}
	r.mu.Lock()
	_ = r.w.Close()
	r.mu.Unlock()
	return r.cmd.Wait()
}

// reaperRounds bounds how often the reaper looks again for descendants of
// what it killed (which may have forked meanwhile), reaperRoundGap the pause
// between rounds.
const (
	reaperRounds   = 5
	reaperRoundGap = 20 * time.Millisecond
)

// RunReaper is the reaper process's body: it reads add/del/addpid/delpid
// lines from in until EOF, then SIGKILLs every process group and process
// still listed, and every descendant of theirs, and returns. It ignores
// SIGINT, SIGTERM and SIGHUP, which are meant for the supervisor: the
// supervisor's death, seen as EOF, is its only cue.
func RunReaper(in io.Reader) error {
	signal.Ignore(syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	groups := map[int]bool{}
	pids := map[int]uint64{}
	sc := bufio.NewScanner(in)
	for sc.Scan() {
		verb, arg, ok := strings.Cut(sc.Text(), " ")
		if !ok {
			continue
		}
		switch verb {
		case "add", "del", "delpid":
			id, err := strconv.Atoi(arg)
			if err != nil || id <= 1 {
				continue // never signal 0, 1 or garbage
			}
			switch verb {
			case "add":
				groups[id] = true
			case "del":
				delete(groups, id)
			case "delpid":
				delete(pids, id)
			}
		case "addpid":
			p, s, ok := strings.Cut(arg, " ")
			pid, err1 := strconv.Atoi(p)
			start, err2 := strconv.ParseUint(s, 10, 64)
			if !ok || err1 != nil || err2 != nil || pid <= 1 {
				continue
			}
			pids[pid] = start
		}
	}
	for pgid := range groups {
		_ = unix.Kill(-pgid, unix.SIGKILL)
	}
	for round := 0; round < reaperRounds; round++ {
		if round > 0 {
			time.Sleep(reaperRoundGap)
		}
		all, err := readAllProcs()
		if err != nil {
			return err
		}
		targets := reaperTargets(all, groups, pids)
		if len(targets) == 0 {
			break
		}
		for _, p := range targets {
			killPid(p.pid, p.start)
		}
	}
	return nil
}

// reaperTargets returns the processes in all that are listed (pids, with a
// matching start time), in a listed group, or descend from one of those;
// zombies are left out (they run no more code).
func reaperTargets(all []procInfo, groups map[int]bool, pids map[int]uint64) []procInfo {
	byPid := make(map[int]procInfo, len(all))
	for _, p := range all {
		byPid[p.pid] = p
	}
	memo := map[int]bool{}
	var listed func(pid, depth int) bool
	listed = func(pid, depth int) bool {
		if v, ok := memo[pid]; ok {
			return v
		}
		p, ok := byPid[pid]
		if !ok || pid <= 1 || depth > len(all) {
			return false
		}
		start, isPid := pids[pid]
		v := groups[p.pgid] || (isPid && start == p.start) || listed(p.ppid, depth+1)
		memo[pid] = v
		return v
	}
	var out []procInfo
	for _, p := range all {
		if p.state != "Z" && p.state != "X" && p.pid != os.Getpid() && listed(p.pid, 0) {
			out = append(out, p)
		}
	}
	return out
}
