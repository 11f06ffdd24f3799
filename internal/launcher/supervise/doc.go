// Package supervise starts processes and watches them until nothing they
// started is left: a Spec in, a *Proc out. It knows nothing of ranks,
// standbys or generations; package launcher builds those on top (its
// output prefixes, log files and stderr tails are a LineSink).
//
// # What a Proc guarantees
//
// Each process runs in its own process group (Setpgid), so that Signal and
// Stop reach everything it started, with PR_SET_PDEATHSIG SIGKILL, so that
// the kernel kills it when the supervising process dies. Its stdout and
// stderr are read line by line (MaxLine bounds a line; a last line without
// a newline is still delivered) into the Spec's LineSink. The process is
// reaped with wait4 on its pid alone (never wait4(-1), which would steal
// other children's statuses). Exited closes when the exit is known: at
// wait4, or earlier when both pipes reached EOF and /proc says every thread
// is exiting (Exit.Early; procfs.go explains why that pays off with CUDA).
// After the exit the output is drained: pipes no process holds any more
// are read to their end, however long that takes; descendants in the group get
// Config.DrainGrace to close the pipes before the group is SIGKILLed, and
// pipes held only by processes that left the group are closed on them after
// DrainOrphanWait. Then the group is killed, leftover descendants are killed
// and reaped, the sink is closed (SinkCloser) and Done closes. Every
// goroutine a Proc starts has ended by then.
//
// # Descendants that leave the group
//
// A process that calls setsid or setpgid (a daemon, `setsid cmd &`) is out
// of reach of the group kill and of PDEATHSIG. New makes the supervising
// process a child subreaper (PR_SET_CHILD_SUBREAPER): orphans of its
// descendants are re-parented to it, not to init. Start adds TagEnv, a tag
// unique to the Proc, to its environment; descendants inherit it. A scan of
// /proc (Supervisor.scan) then classifies every descendant of this process:
//
//   - under a running Proc and outside its group: an escapee of that Proc;
//   - a child of this process that is no Proc (an adopted orphan): the Proc
//     whose tag it carries, or an escapee of unknown owner when it carries
//     none (its environment was cleared);
//   - children of this process in its own process group (exec.Cmd started
//     by other code, py-spy) and the reaper process are left alone, as are
//     all strangers while a Start is forking. Other code of this process
//     must therefore not start children in process groups of their own.
//
// When a Proc's process ends, its escapees (and whatever of its group
// survived, now adopted) are SIGKILLed (through a pidfd, after checking the
// start time, so a reused pid is never hit) and reaped by pid, before Done
// closes; escapees of unknown owner go with the next Proc that ends. While
// processes run, Run scans every ScanPeriod, tells the reaper process about
// escapees ("addpid PID START"), forgets those gone ("delpid PID"), reaps
// adopted orphans that exited, and kills whatever of an ended Proc showed up
// late.
//
// The reaper process (RunReaper, reaper.go) covers the supervising
// process's own death, SIGKILL included: at its stdin's EOF it kills the
// listed groups and processes and their descendants. The gap: a process
// that leaves its group less than one ScanPeriod before the supervising
// process is SIGKILLed is not yet listed; if its Proc's process died too
// (PDEATHSIG) it is re-parented to init before the reaper looks, and lives
// on. A shorter ScanPeriod narrows that window at the cost of more /proc
// reads (one per process on the machine per scan).
//
// # Why not a cgroup
//
// cgroup v2's cgroup.kill would kill every descendant atomically, with no
// window. But a cgroup of our own needs a writable, delegated subtree:
// non-root users rarely have one outside systemd user sessions, Slurm owns
// the job step's cgroup (moving processes out of it breaks its accounting
// and limits), and containers often mount /sys/fs/cgroup read-only or still
// run cgroup v1. The subreaper and /proc scan work everywhere Linux ≥ 3.4
// does, for any user, and leave the resource controllers to whoever owns
// them; it is the one mechanism, rather than a cgroup path with a fallback
// that is rarely exercised.
//
// # Usage
//
//	reaper, err := supervise.StartReaper([]string{self, "launch", "_reaper"})
//	if err != nil { log a warning; reaper is nil and still usable }
//	defer reaper.Close() // after every Proc is Done
//	s, err := supervise.New(supervise.Config{Reaper: reaper, Logger: log})
//	g.Go(func() error { return s.Run(ctx) }) // under the agent's errgroup
//	p, err := s.Start(supervise.Spec{Path: prog, Args: args, Env: env, Output: sink})
//	<-p.Exited(); e := p.Exit() // e.ExitCode(), e.Signal, e.Early
//	p.Stop(syscall.SIGTERM, grace) // or p.Signal(sig)
//	<-p.Done()
//
// The reaper process runs `gotrain launch _reaper`, whose body is RunReaper
// (os.Stdin).
//
// # Moving package launcher over
//
//   - workerSpec{program, args, env} → Spec{Path, Args, Env}; the rank,
//     generation, standby slot and log dir stay in launcher.
//   - console + route + tail → one LineSink per worker (Line writes the
//     prefixed line to the console for its Stream, copies it to the log via
//     route, and adds Stderr lines to the tail); route.close(exit) becomes
//     its SinkCloser.Close. lines.go keeps console, tail and route; pump and
//     maxLine move here.
//   - startWorker → s.Start, keeping the "check the program path after --"
//     hint (errors.Is(err, exec.ErrNotFound / os.ErrNotExist)); the evidence
//     and pinning use p.Pid().
//   - workerProc.exited/done/exit/early → Exited(), Done(), Exit() (with
//     Exit.Code, Signal, Early, Err; ExitCode(), String()).
//   - workerProc.signal/stop → Signal, Stop.
//   - reaper.go's startReaper/reaper → StartReaper/*Reaper (Start tells it
//     about groups itself; launcher no longer calls add/del); the agent also
//     runs Supervisor.Run; cmd/gotrain calls supervise.RunReaper.
//   - exitearly.go, drain, drainGrace and drainOrphanWait go away
//     (Config.DrainGrace, DrainOrphanWait; the defaults are today's values).
package supervise
