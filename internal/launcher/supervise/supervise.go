package supervise

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// Config configures a Supervisor. The zero value of a duration means its
// default (DefaultConfig).
type Config struct {
	// Reaper is told about process groups and escaped descendants, so that
	// it kills them if this process dies; nil: no reaper.
	Reaper *Reaper
	// ScanPeriod is how often Run looks for descendants that left their
	// process group while processes run (default 500 ms). A process that
	// escapes less than one period before this process is SIGKILLed is
	// not yet known to the reaper and may outlive it.
	ScanPeriod time.Duration
	// DrainGrace is how long a process's descendants in its group get to
	// close its output pipes after it exited, before the group is killed;
	// and how long the pipes then get before they are closed (default 2 s).
	DrainGrace time.Duration
	// DrainOrphanWait is the wait instead of DrainGrace when the group is
	// already empty, so that only processes that left it hold the pipes
	// (default 100 ms).
	DrainOrphanWait time.Duration
	// CleanupWait bounds how long a Proc's Done waits for its killed
	// leftover descendants to vanish (a process in uninterruptible sleep
	// can take long); Run's scans keep killing and reaping what is left
	// (default 2 s).
	CleanupWait time.Duration
	// Logger receives the few things worth a log line; nil: none.
	Logger *slog.Logger
}

// DefaultConfig returns the defaults, without a reaper.
func DefaultConfig() Config {
	return Config{
		ScanPeriod:      500 * time.Millisecond,
		DrainGrace:      2 * time.Second,
		DrainOrphanWait: 100 * time.Millisecond,
		CleanupWait:     2 * time.Second,
	}
}

func (c Config) withDefaults() (Config, error) {
	d := DefaultConfig()
	for _, f := range []struct {
		name string
		v    *time.Duration
		def  time.Duration
	}{
		{"ScanPeriod", &c.ScanPeriod, d.ScanPeriod},
		{"DrainGrace", &c.DrainGrace, d.DrainGrace},
		{"DrainOrphanWait", &c.DrainOrphanWait, d.DrainOrphanWait},
		{"CleanupWait", &c.CleanupWait, d.CleanupWait},
	} {
		switch {
		case *f.v < 0:
			return c, fmt.Errorf("supervise: %s %s is negative", f.name, *f.v)
		case *f.v == 0:
			*f.v = f.def
		}
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c, nil
}

// Supervisor starts processes and makes sure that nothing they start
// outlives them (doc.go). One per OS process: it makes this process a child
// subreaper and adopts whatever its processes leave behind.
type Supervisor struct {
	cfg       Config
	self      int
	selfPgid  int
	tagPrefix string // "PID.N." with N unique to the Supervisor

	mu       sync.Mutex
	seq      int
	starting int              // Starts with a fork under way
	workers  map[int]*Proc    // by pid, until wait4 reaped it
	byTag    map[string]*Proc // by tag, until its cleanup is over
	escaped  map[int]escapee  // descendants outside their Proc's group, by pid
	gone     *Proc            // the owner of tagged processes whose Proc is forgotten

	// started wakes Run after a Start: programs that detach a daemon
	// mostly do it as they start, so Run scans sooner then (quickScans).
	started chan struct{}
}

// quickScans are the delays of Run's scans after a Start, before it goes
// back to ScanPeriod: they narrow the window in which a descendant that
// just left its group is not yet known to the reaper.
var quickScans = []time.Duration{20 * time.Millisecond, 80 * time.Millisecond, 200 * time.Millisecond}

// escapee is a descendant outside its Proc's process group.
type escapee struct {
	start uint64
	owner *Proc // nil: unknown (no tag, not seen under its Proc)
}

var supervisors atomic.Int64

// New makes this process a child subreaper (PR_SET_CHILD_SUBREAPER), so that
// orphans of the processes it starts are re-parented to it rather than to
// init, and returns a Supervisor. Run its scan loop with Run.
func New(cfg Config) (*Supervisor, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		return nil, fmt.Errorf("supervise: become a child subreaper: %w", err)
	}
	s := &Supervisor{
		cfg: cfg, self: os.Getpid(), selfPgid: unix.Getpgrp(),
		workers: map[int]*Proc{}, byTag: map[string]*Proc{}, escaped: map[int]escapee{},
		gone: &Proc{ended: true}, started: make(chan struct{}, 1),
	}
	s.tagPrefix = fmt.Sprintf("%d.%d.", s.self, supervisors.Add(1))
	return s, nil
}

// Run scans this process's descendants every ScanPeriod while any Proc
// runs or escaped descendants are known: it tells the reaper about
// descendants outside their Proc's group, kills those whose Proc has ended,
// and reaps adopted orphans. It returns nil when ctx is done.
func (s *Supervisor) Run(ctx context.Context) error {
	t := time.NewTimer(s.cfg.ScanPeriod)
	defer t.Stop()
	quick := len(quickScans) // index of the next quick scan; none left
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-s.started:
			quick = 0
			t.Reset(quickScans[0])
			continue
		case <-t.C:
		}
		s.mu.Lock()
		busy := len(s.workers) > 0 || len(s.escaped) > 0
		s.mu.Unlock()
		if busy {
			s.scan(nil)
		}
		if quick++; quick < len(quickScans) {
			t.Reset(quickScans[quick] - quickScans[quick-1])
		} else {
			t.Reset(s.cfg.ScanPeriod)
		}
	}
}

// Escaped returns the pids of the known descendants that left their Proc's
// process group (those the reaper was told about), for logs and tests.
func (s *Supervisor) Escaped() []int {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]int, 0, len(s.escaped))
	for pid := range s.escaped {
		out = append(out, pid)
	}
	return out
}

// reaped forgets p's pid, which wait4 just freed.
func (s *Supervisor) reaped(p *Proc) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.workers, p.pid)
}

// cleanup kills and reaps what is left of p: after p ended, its descendants
// outside its group (and those of its group that survived the group kill)
// are this process's children. It returns once none is left, or after
// CleanupWait.
func (s *Supervisor) cleanup(p *Proc) {
	s.mu.Lock()
	p.ended = true
	s.mu.Unlock()
	deadline := time.Now().Add(s.cfg.CleanupWait)
	for s.scan(p) > 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	s.mu.Lock()
	delete(s.byTag, p.tag)
	s.mu.Unlock()
}

// owner finds whose a stranger child of this process is, by the tag it
// inherited: its Proc, s.gone for a Proc already forgotten, nil when it
// carries no tag of this Supervisor.
func (s *Supervisor) owner(pid int) *Proc {
	tag := procEnv(pid, TagEnv)
	if !strings.HasPrefix(tag, s.tagPrefix) {
		return nil
	}
	if p, ok := s.byTag[tag]; ok {
		return p
	}
	return s.gone
}

// scan walks this process's descendants. Every descendant of a running Proc
// that left its process group, and every stranger child (an orphan
// re-parented to this subreaper), is an escapee: the reaper is told about
// it. Escapees whose Proc has ended are killed, and so are those of unknown
// owner while cleaning up after a Proc (cleanup not nil); zombie children
// are reaped, by pid. It returns how many processes still due to be killed
// were found of cleanup's, or of no known owner.
func (s *Supervisor) scan(cleanup *Proc) (left int) {
	// The lock is held from the read of /proc on: wait4 may reap a Proc
	// meanwhile, but its pid stays in workers (reaped waits for the lock),
	// so it is never taken for a stranger, and no pid this scan acts on can
	// have been reused.
	s.mu.Lock()
	defer s.mu.Unlock()
	all, err := readAllProcs()
	if err != nil {
		s.cfg.Logger.Warn("scan of descendants failed", "err", err)
		return 0
	}
	w := &scanWalk{s: s, cleanup: cleanup, limit: len(all), children: map[int][]procInfo{}, found: map[int]escapee{}}
	for _, p := range all {
		w.children[p.ppid] = append(w.children[p.ppid], p)
	}
	reaperPid := s.cfg.Reaper.Pid()
	for _, c := range w.children[s.self] {
		s.visitChild(w, c, reaperPid)
	}
	s.tellReaper(w.found)
	s.escaped = w.found
	return w.left
}

// scanWalk is one scan's walk of the process tree; it and the methods
// scan calls run with s.mu held.
type scanWalk struct {
	s        *Supervisor
	cleanup  *Proc // scan's cleanup
	limit    int   // deeper than the number of processes: a cycle
	children map[int][]procInfo
	found    map[int]escapee // the escapees found
	left     int             // scan's result
}

// visitChild visits c, a child of this process, and its descendants, as
// whoever c belongs to.
func (s *Supervisor) visitChild(w *scanWalk, c procInfo, reaperPid int) {
	if p, ok := s.workers[c.pid]; ok {
		for _, gc := range w.children[c.pid] {
			w.visit(gc, p, p.pid, 1)
		}
		return
	}
	if e, ok := s.escaped[c.pid]; ok && e.start == c.start {
		w.visit(c, e.owner, -1, 0)
		return
	}
	if c.pid == reaperPid || c.pgid == s.selfPgid || s.starting > 0 {
		// The reaper; a child started by other code of this process
		// (exec.Cmd without Setpgid); a fork under way in Start.
		return
	}
	owner, group := s.owner(c.pid), -1
	if owner != nil && !owner.ended {
		// Orphaned inside a running Proc's group (its parent died):
		// the group kill still reaches it.
		group = owner.pid
	}
	w.visit(c, owner, group, 0)
}

// visit handles descendant p of Proc owner (nil: unknown), whose process
// group is group, and then p's descendants.
func (w *scanWalk) visit(p procInfo, owner *Proc, group int, depth int) {
	s, cleanup := w.s, w.cleanup
	if depth > w.limit {
		return // a cycle in a torn read of /proc
	}
	switch {
	case p.state == "Z" || p.state == "X":
		if p.ppid == s.self {
			// An adopted orphan that ended: reap it, by its pid.
			var ws unix.WaitStatus
			_, _ = unix.Wait4(p.pid, &ws, unix.WNOHANG, nil)
		}
	case p.pgid == group:
		// In its Proc's group: the group kill reaches it.
	case (owner != nil && owner.ended) || (owner == nil && cleanup != nil):
		if owner == cleanup || owner == nil || owner == s.gone {
			w.left++
		}
		killPid(p.pid, p.start)
	default:
		w.found[p.pid] = escapee{start: p.start, owner: owner}
	}
	for _, c := range w.children[p.pid] {
		w.visit(c, owner, group, depth+1)
	}
}

// tellReaper tells the reaper about the escapees that are new in found
// (or whose pid was reused) and that the known ones not in it are gone.
func (s *Supervisor) tellReaper(found map[int]escapee) {
	for pid := range s.escaped {
		if _, ok := found[pid]; !ok {
			s.cfg.Reaper.delPid(pid)
		}
	}
	for pid, e := range found {
		if old, ok := s.escaped[pid]; !ok || old.start != e.start {
			s.cfg.Reaper.addPid(pid, e.start)
		}
	}
}
