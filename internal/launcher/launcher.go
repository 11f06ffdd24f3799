package launcher

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sync/errgroup"
	"golang.org/x/sys/unix"

	"github.com/gotrain/gotrain/internal/jobenv"
	"github.com/gotrain/gotrain/internal/jobenv/genwire"
	"github.com/gotrain/gotrain/internal/jobtls"
	"github.com/gotrain/gotrain/internal/launcher/agentcore"
	"github.com/gotrain/gotrain/internal/launcher/explain"
	"github.com/gotrain/gotrain/internal/launcher/observe"
	"github.com/gotrain/gotrain/internal/launcher/output"
	"github.com/gotrain/gotrain/internal/launcher/placement"
	"github.com/gotrain/gotrain/internal/launcher/pystandby"
	"github.com/gotrain/gotrain/internal/launcher/recovery"
	"github.com/gotrain/gotrain/internal/launcher/relay"
	"github.com/gotrain/gotrain/internal/launcher/reportq"
	"github.com/gotrain/gotrain/internal/launcher/signals"
	"github.com/gotrain/gotrain/internal/launcher/snaptier"
	"github.com/gotrain/gotrain/internal/launcher/supervise"
	"github.com/gotrain/gotrain/internal/launcher/workerenv"
	"github.com/gotrain/gotrain/internal/nodehealth"
	"github.com/gotrain/gotrain/internal/preflight"
	"github.com/gotrain/gotrain/internal/pyinterp"
	"github.com/gotrain/gotrain/internal/runfile"
	"github.com/gotrain/gotrain/internal/torchhook"
	gotrainv1 "github.com/gotrain/gotrain/proto/gotrain/v1"
)

// ExitError is a job that ended badly: Code is what `gotrain launch` exits with.
type ExitError struct {
	Code    int
	Message string
}

func (e *ExitError) Error() string { return e.Message }

// Run runs the agent until the job finishes. It returns nil when every
// worker succeeded, a *signals.Stopped when SIGINT or SIGTERM (from cfg.Signals, or
// ctx's of StopOnSignal) stopped it, whatever it was waiting for, an
// *ExitError when the job failed, and another error when the agent itself
// could not do its work.
func Run(ctx context.Context, cfg Config) error {
	if !signals.HasStop(ctx) { // cmd/gotrain made it before its own waits (cmd/gotrain/internal/slurm)
		var stop context.CancelFunc
		ctx, cfg.Signals, stop = signals.StopOnSignal(ctx, cfg.Signals) // signals/stop.go
		defer stop()
	}
	return signals.StopCause(ctx, run(ctx, cfg))
}

func run(ctx context.Context, cfg Config) error {
	tokenMade := cfg.JobToken == "" // then setDefaults makes one, and the join hint says where it is kept
	if err := cfg.setDefaults(); err != nil {
		return err
	}
	if err := cfg.validate(); err != nil {
		return err
	}
	given := cfg.Program
	if prog, args, err := resolveProgram(cfg.Program, cfg.Args, cfg.Stderr); err != nil {
		return err
	} else {
		cfg.Program, cfg.Args = prog, args
	}
	argv0 := ""
	if !strings.HasSuffix(given, ".py") {
		argv0 = given // the program's argv[0] as given, as a shell or torchrun passes it
	}
	var py *pystandby.Program
	var pyCold string
	if cfg.Standby != StandbyOff && cfg.Standby != "" {
		py, pyCold = pystandby.Parse(cfg.Program, cfg.Args) // internal/launcher/pystandby
	}
	if cfg.LogDir != "" {
		if err := output.CheckLogRoot(cfg.LogDir); err != nil { // output/logdir.go
			return err
		}
	}
	a := &agent{cfg: cfg, argv0: argv0, log: cfg.Logger, host: hostname(), tokenMade: tokenMade, py: py, pyCold: pyCold,
		stdout: output.NewConsole(cfg.Stdout), stderr: output.NewConsole(cfg.Stderr)}
	a.logTrouble = output.NewTrouble(a.stderr)
	a.place = placement.Node(a.cfg.Backend, a.cfg.Env, a.cfg.NprocPerNode, a.cfg.Stderr, a.log)
	a.oomFile = observe.AgentMemoryEventsFile()
	return a.run(ctx)
}

// resolveProgram finds the program the way a shell would, so that a typo is
// reported before any coordinator or worker starts. A Python script
// (SCRIPT.py) runs with the interpreter gotrain torchrun would choose
// (internal/pyinterp), saying which and why once on stderr.
func resolveProgram(p string, args []string, stderr io.Writer) (string, []string, error) {
	return resolveProgramIn(pyinterp.System("-- python3 "+p), p, args, stderr)
}

func resolveProgramIn(env pyinterp.Env, p string, args []string, stderr io.Writer) (string, []string, error) {
	if strings.HasSuffix(p, ".py") {
		if st, err := os.Stat(p); err != nil {
			return "", nil, fmt.Errorf("program %s: %w", p, err)
		} else if st.IsDir() {
			return "", nil, fmt.Errorf("program %s is a directory", p)
		}
		torch := pyinterp.ImportsTorch(p)
		py, err := pyinterp.Choose(env, torch)
		if err != nil && torch {
			return "", nil, fmt.Errorf("%s imports torch, but %w", p, err)
		} else if err != nil {
			return "", nil, fmt.Errorf("%s is a Python script, but %w", p, err)
		}
		fmt.Fprintf(stderr, "gotrain: running %s with %s (%s)\n", p, py.Path, py.Why)
		return py.Path, append([]string{p}, args...), nil
	}
	prog, err := resolveCommand(p)
	return prog, args, err
}

func resolveCommand(p string) (string, error) {
	if strings.Contains(p, "/") {
		st, err := os.Stat(p)
		if err != nil {
			return "", fmt.Errorf("program %s: %w", p, err)
		}
		if st.IsDir() || st.Mode()&0o111 == 0 {
			return "", fmt.Errorf("program %s is not executable (chmod +x it, or run it through its interpreter: -- python3 %s)", p, p)
		}
		return filepath.Abs(p)
	}
	for _, dir := range filepath.SplitList(os.Getenv("PATH")) {
		full := filepath.Join(dir, p)
		if st, err := os.Stat(full); err == nil && !st.IsDir() && st.Mode()&0o111 != 0 {
			return full, nil
		}
	}
	return "", fmt.Errorf("program %q not found in PATH (give a path such as ./%s)", p, p)
}

type agent struct {
	cfg    Config
	argv0  string // the workers' argv[0] ("": cfg.Program)
	log    *slog.Logger
	host   string
	stdout *output.Console
	stderr *output.Console

	coord       gotrainv1.CoordinatorClient
	replicaView // the coordinator's replicas, as this agent knows them (replicas.go)
	keysView    // the pin and the job CA (keys.go)
	nodeID      string
	socket      string
	sup         *supervise.Supervisor // starts and watches every process (internal/launcher/supervise)
	place       *placement.Placement  // GPUs in NVLink order and their CPUs (internal/launcher/placement); nil without NVML
	hub         *relay.Hub            // the ranks' progress, reported once a second (relay/progress.go)
	// logTrouble warns once when the log dir cannot be written (output/logdir.go).
	logTrouble *output.Trouble
	// oomFile holds the workers' memory cgroup's oom_kill counter
	// (observe/rootcause.go); "" when there is none.
	oomFile string
	// metricsAddr is where the embedded coordinator serves /metrics; "" if not.
	metricsAddr string
	// joinHint is the command line the other nodes run, printed once this
	// node joined its embedded coordinator; "" for one node or without one.
	joinHint string
	// preflightFailure is why this node failed its preflight checks, sent
	// with its Join; "" when it passed or ran none.
	preflightFailure string
	// gangExit: the preflight gang check kept this node's ranks from
	// starting (gang.go).
	gangExit *ExitError
	// gangSeen: the nodes of the last generation this node started in.
	gangSeen []string
	// tokenMade: this agent made the job token (none was given).
	tokenMade bool
	// hostKey: the embedded coordinator's secret this agent joins with, to
	// be the job's first node (internal/coordinator/host's HostKey); nil otherwise.
	hostKey []byte
	// gossipPort is the coordinator's gossip port from Join; 0: no gossip.
	gossipPort int
	// nodeTimeout is how long this node may be out of contact with the
	// coordinator (the job's --node-timeout, from Join): the agent
	// reconnects within it, and stops its workers when it cannot.
	nodeTimeout time.Duration

	// py is the Python program whose standbys are warm interpreters
	// (internal/launcher/pystandby); nil when it is none, or pyCold says why it cannot be
	// pre-warmed.
	py     *pystandby.Program
	pyCold string

	// The machine decides (internal/launcher/agentcore); the loop's goroutine alone
	// steps it and carries out its actions (actions.go).
	m *agentcore.Machine
	// reg is the processes the machine asked for, until their exit was
	// stepped, and what each is (registry.go): the loop's goroutine alone
	// writes it. claims is its view for the relay's hello checks
	// (relay/claims.go).
	reg    *registry
	claims *relay.Claims
	// gen is the current generation as the coordinator sent it (handed to
	// survivors and standbys as it is); nil before the first.
	gen *gotrainv1.GenerationStarted
	// lastEnded is the generation that ended, until the next one starts.
	lastEnded *gotrainv1.GenerationEnded
	// finished is the coordinator's verdict, once it came.
	finished *gotrainv1.JobFinished
	// rewatching: the watch stream broke and is being opened again
	// (contact.go).
	rewatching atomic.Bool
	// forced is the second SIGINT or SIGTERM, which killed the workers at
	// once; 0 if none came.
	forced syscall.Signal
	// inbox carries events from the agent's other goroutines to the loop;
	// loopDone closes when the loop returned, so that nothing blocks on it.
	inbox    chan agentcore.Event
	loopDone chan struct{}
	// waits counts what must end before the agent returns: every process
	// until it is reaped, and the goroutine that forwards its exit.
	waits sync.WaitGroup

	links   *relay.Standbys                 // standbys' open streams (relay/standby.go)
	reports *reportq.Queue                  // to the reporter (report.go)
	hangs   chan *gotrainv1.EvidenceRequest // to the evidence collector (report.go)
	started chan struct{}                   // closed at the first generation
	pyDir   string                          // where gotrain's Python modules go: gotrain_snapshot.py, torchhook's sitecustomize.py
	pyPath  string                          // pyDir once a module is in it, last on workers' PYTHONPATH (snapshots.go)
	// nodeCert is the node certificate Join issued (tls.go); nil before.
	nodeCert *tls.Certificate
	// snapPeers replicates snapshots to the ring neighbour and fetches a
	// replaced rank's from peers (package snaptier); nil: none. snapPeerAddr is
	// its address, published in each generation.
	snapPeers    *snaptier.Peers
	snapPeerAddr string
	// recov times the restarts (recoveries.go); learned is what the
	// first attempt imported, for Python standbys (preload.go).
	recov   recoveryWatch
	learned learnedImports
	// ooms are the CUDA out-of-memory errors this node's ranks ended with,
	// newest last (cudaoom.go); only the loop's goroutine uses them.
	ooms []explain.OOMSeen
}

// tickEvery is how often the loop gives the machine the time (grace
// periods, standbys' hello timeout).
const tickEvery = 100 * time.Millisecond

func (a *agent) run(ctx context.Context) error {
	// A private directory for the workers' socket: its mode keeps other users out.
	dir, err := relay.MakeSocketDir(a.log) // relay/sockdir.go: and removes those of agents that are gone
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	a.socket = filepath.Join(dir, "agent.sock")

	reaper, err := supervise.StartReaper(a.cfg.ReaperCommand)
	if err != nil {
		a.log.Warn("no orphan reaper: processes started by workers may outlive a SIGKILLed agent", "err", err)
	}
	// Closed once every process is gone (runWorkers waits for them).
	defer reaper.Close()
	if a.sup, err = supervise.New(supervise.Config{Reaper: reaper, Logger: a.log.With("component", "supervise")}); err != nil {
		return fmt.Errorf("supervise workers: %w", err)
	}

	coordAddr, trust := a.cfg.Coordinator, a.cfg.Trust
	if coordAddr == "" {
		a.setPhase(ctx, "starting the coordinator")
		addr, pin, stopCoord, err := a.startCoordinator(ctx)
		if err != nil {
			return err
		}
		defer stopCoord()
		coordAddr, trust = addr, jobtls.Trust{CAHash: pin} // this node trusts its own coordinator by its pin
	}

	// The node proves itself before it joins (preflight.go): a node an
	// elastic job can do without stays out; one it cannot, joins saying
	// why, and the job fails before any step.
	if a.preflightFailure, err = a.preflight(ctx); err != nil {
		return err
	}

	conn, err := a.joinConnected(ctx, coordAddr, trust) // tls.go
	if err != nil {
		return a.preflightRefused(err) // preflight.go
	}
	defer conn.Close()
	if a.preflightFailure != "" && a.cfg.Coordinator != "" {
		// The coordinator took the join with the failure: the job is over
		// (job.failPreflight), and the nodes that watch it heard so. This
		// node need not watch to learn it; the one that runs the
		// coordinator goes on, to serve the result to the others.
		return &ExitError{Code: preflight.ExitStatus, Message: fmt.Sprintf("gotrain: this node (%s) failed preflight, and the job does not start without it; every node exits %d", a.host, preflight.ExitStatus)}
	}
	a.log = a.log.With("node", a.nodeID)
	defer a.startGossip(coordAddr)() // gossip.go
	if a.joinHint != "" {
		// Printed after this node joined, so that it is the first node
		// (node ids break ties in the rank order of nodes on one host).
		fmt.Fprintln(a.cfg.Stderr, a.joinHint)
	}
	if a.cfg.LogDir != "" {
		// The run's own directory, now that the run id is known (output/logdir.go).
		dir, err := output.OpenRunLogDir(a.cfg.LogDir, a.cfg.RunID)
		if err != nil {
			return err
		}
		a.cfg.LogDir = dir
		fmt.Fprintf(a.cfg.Stderr, "gotrain: logs in %s\n", dir)
	}
	if f, err := runfile.Write(runfile.Job{RunID: a.cfg.RunID, Coordinator: a.coordinatorAddrs(coordAddr), Token: a.cfg.JobToken, Metrics: a.metricsAddr, Trust: a.trust}); err == nil {
		defer f.Remove() // lets `gotrain diagnose` find this job
	} else {
		a.log.Warn("no run file for gotrain diagnose", "err", err)
	}
	return a.runWorkers(ctx, coordAddr)
}

// runWorkers runs the node's part of the job once it joined: the agent's
// subsystems, each a goroutine under one errgroup, and the loop that steps
// the machine. Everything it starts has ended when it returns.
func (a *agent) runWorkers(ctx context.Context, coordAddr string) error {
	lis, err := relay.Listen(a.socket, a.log) // relay/bounds.go
	if err != nil {
		return fmt.Errorf("listen on the workers' socket: %w", err)
	}
	a.m = agentcore.New(agentcore.Config{
		Node:  jobenv.Node{AgentSocket: a.socket, JobToken: a.cfg.JobToken, RunID: a.cfg.RunID, Backend: a.cfg.Backend, Host: a.cfg.NodeAddress},
		Grace: a.cfg.GracePeriod, Standby: a.cfg.Standby, StandbyTimeout: a.cfg.StandbyTimeout,
		Python: a.py != nil || a.pyCold != "", PythonCold: a.pyCold,
		NoRestarts: a.cfg.MaxRestarts == 0 && (a.cfg.MinNodes == 0 || a.cfg.MinNodes == a.cfg.Nodes),
	})
	a.claims = relay.NewClaims()
	a.inbox, a.loopDone = make(chan agentcore.Event), make(chan struct{})
	a.links = relay.NewStandbys()
	a.reports = reportq.New()
	a.hangs = make(chan *gotrainv1.EvidenceRequest, 8)
	a.hub = relay.NewHub(a.log, a.coord, a.nodeID)
	a.reg = &registry{procs: map[agentcore.ProcID]*workerProc{}, claims: a.claims, hub: a.hub, place: a.place,
		log: a.log, logDir: a.cfg.LogDir, logTrouble: a.logTrouble, oomFile: a.oomFile}
	a.hub.Notify(func(pid, rank int, gen int64, recoverable bool) {
		a.post(agentcore.Attached{Pid: pid, Rank: rank, Generation: gen, Recoverable: recoverable})
	}, func(pid int) { a.post(agentcore.Detached{Pid: pid}) })

	// The subsystems outlive a signal (ctx's end) until the workers are
	// gone: they supervise and report them while they stop.
	subCtx, stopSubsystems := context.WithCancel(context.WithoutCancel(ctx))
	defer stopSubsystems()
	g, gctx := errgroup.WithContext(subCtx)
	// Each connection's peer pid, which hellos must name (relay/claims.go).
	relaySrv := relay.NewGRPCServer(a.cfg.JobToken, &relay.Server{Coord: a.coord, NodeID: a.nodeID, Hub: a.hub, Claims: a.claims,
		Standbys: a.links, Post: a.post, LoopDone: a.loopDone, Log: a.log})
	g.Go(func() error { return relaySrv.Serve(lis) })
	a.pyDir = filepath.Join(filepath.Dir(a.socket), "python")
	if tp := a.installTorchHook(a.pyDir, filepath.Dir(a.socket)); tp != nil { // observers.go
		a.hub.SetTorch(tp)
		a.pyPath = a.pyDir
	}
	a.startSnapshots(gctx, g, filepath.Dir(a.socket)) // snapshots.go
	g.Go(func() error { return a.sup.Run(gctx) })
	g.Go(func() error { a.hub.Report(gctx); return nil })
	a.startGPUSampling(gctx, g)                                // observers.go
	a.startRASPoll(gctx, g)                                    // observers.go
	g.Go(func() error { a.sendReports(gctx); return nil })     // report.go
	g.Go(func() error { a.collectEvidence(gctx); return nil }) // report.go

	stream, err := a.coord.WatchGenerations(gctx, &gotrainv1.WatchGenerationsRequest{NodeId: a.nodeID, Stream: a.streams.Add(1)})
	if err != nil && !final(err) && restarted(err) == nil {
		// The coordinator went away between the join and the first watch
		// (it crashed, its leader changed): try again as after a stream
		// lost later, within the node timeout (contact.go).
		var stop func()
		stream, stop, err = a.rewatch(gctx, err, time.Now(), false)
		if stop != nil {
			defer stop()
		}
	}
	if err != nil {
		relaySrv.Stop()
		stopSubsystems()
		_ = g.Wait()
		if re := restarted(err); re != nil && len(a.replicaSet()) <= 1 {
			return a.restartedExit(re) // keys.go
		}
		return fmt.Errorf("watch the coordinator at %s: %w", coordAddr, err)
	}
	events := make(chan *gotrainv1.GenerationEvent)
	streamErr := make(chan error, 1)
	started := make(chan struct{})
	g.Go(func() error { a.watch(gctx, stream, events, streamErr, coordAddr); return nil }) // contact.go
	g.Go(func() error { a.waitForStart(gctx, started); return nil })                       // join.go
	a.started = started

	f, lost := a.loop(ctx, coordAddr, events, streamErr)
	close(a.loopDone)
	// Every process is reaped before the relay stops: standbys, killed by
	// now, never see their agent go first.
	a.waits.Wait()
	relaySrv.Stop()
	stopSubsystems()
	_ = g.Wait()

	if a.gangExit != nil {
		return a.gangExit // gang.go: no rank started
	}
	switch f.Why {
	case agentcore.FinishedJob:
		a.recordRootCause(a.finished)
		if fl := a.finished.GetFailure(); fl != nil && fl.GetHostname() == a.host && len(fl.GetXidErrors()) > 0 {
			a.recordVerdict(nodehealth.XID, strings.Join(fl.GetXidErrors(), "; "))
		}
		return a.finish(a.finished)
	case agentcore.FinishedSignal:
		if st := signals.StoppedBy(ctx); st != nil {
			s := *st
			s.Forced = a.forced
			return &s
		}
		sig := syscall.Signal(f.Code - 128)
		return &ExitError{Code: f.Code, Message: fmt.Sprintf("gotrain: stopped by %s", unix.SignalName(sig))}
	case agentcore.FinishedLost:
		if errors.As(lost, new(*coordinatorRestarted)) { // keys.go: not a blip, not this node's loss
			return a.restartedExit(lost)
		}
		if why, ok := droppedStraggler(lost); ok {
			a.recordVerdict(nodehealth.Straggler, why)
			return &ExitError{Code: 1, Message: fmt.Sprintf("gotrain: this node (%s) left the job: %s; its workers were stopped", a.host, why)}
		}
		a.recordVerdict(nodehealth.Lost, "lost the coordinator: "+lost.Error())
		return fmt.Errorf("lost the coordinator at %s: %w; this node's workers on %s were stopped", coordAddr, lost, a.host)
	}
	return ctx.Err()
}

// phase is what the loop waits for or runs at now, for the message of a
// signal that stops it (signals/stop.go).
func (a *agent) phase(now time.Time, coordAddr string) string {
	if silent, _ := a.hub.Silence(now); (silent > 0 || a.rewatching.Load()) && a.gen != nil {
		// The watch stream broke, or the coordinator has not answered the
		// last progress report (it is cut off, or has no majority): the
		// workers run on meanwhile (contact.go).
		return fmt.Sprintf("waiting for the coordinator at %s to answer again (generation %d runs on meanwhile)", coordAddr, a.gen.GetGeneration())
	}
	switch {
	case a.gen == nil && a.cfg.Nodes > 1:
		return fmt.Sprintf("waiting for the job's other nodes to join (--nnodes %s)", a.nnodes())
	case a.gen == nil:
		return "waiting for the job to start"
	case a.lastEnded != nil:
		return fmt.Sprintf("waiting for the job's next generation (generation %d ended: %s; --restart-backoff)", a.lastEnded.GetGeneration(), a.lastEnded.GetReason())
	}
	return fmt.Sprintf("running generation %d", a.gen.GetGeneration())
}

// setPhase is SetPhase, logged (--verbose) when the phase changes.
func (a *agent) setPhase(ctx context.Context, phase string) {
	if signals.SetPhase(ctx, phase) {
		a.log.Info("phase", "phase", phase)
	}
}

// post hands ev to the loop; it gives up once the loop returned.
func (a *agent) post(ev agentcore.Event) {
	select {
	case a.inbox <- ev:
	case <-a.loopDone:
	}
}

// loop feeds the machine every event until it says the agent is done, and
// returns its Finish and, when the coordinator was lost, why.
func (a *agent) loop(ctx context.Context, coordAddr string, events <-chan *gotrainv1.GenerationEvent, streamErr <-chan error) (agentcore.Finish, error) {
	tick := time.NewTicker(tickEvery)
	defer tick.Stop()
	done := ctx.Done()
	var lost error
	for {
		var ev agentcore.Event
		select {
		case gev := <-events:
			if g := gev.GetStarted(); g != nil && a.gangDue(g) {
				// Before the ranks of a generation with new nodes start (gang.go).
				if err := a.gangCheck(ctx, g); err != nil {
					var ee *ExitError
					if !errors.As(err, &ee) {
						ee = &ExitError{Code: 1, Message: fmt.Sprintf("gotrain: stopped during the preflight gang check: %v", err)}
					}
					a.gangExit = ee
					ev = agentcore.JobFinished{ExitCode: ee.Code}
					break
				}
			}
			ev = a.fromCoordinator(gev)
		case ev = <-a.inbox:
		case sig := <-a.cfg.Signals:
			s, _ := sig.(syscall.Signal)
			if (s == syscall.SIGINT || s == syscall.SIGTERM) && a.m.Stopping() != 0 {
				a.forced = s // the machine kills the workers now
			}
			ev = agentcore.Signaled{Sig: s}
		case now := <-tick.C:
			ev = agentcore.Tick{}
			a.pollRecovery(now)                                  // recoveries.go
			a.learnImports()                                     // preload.go
			if err := a.cutOff(now); err != nil && lost == nil { // contact.go
				lost, streamErr = err, nil
				ev = agentcore.CoordinatorLost{Err: err.Error()}
			}
		case err := <-streamErr:
			lost, streamErr = err, nil
			ev = agentcore.CoordinatorLost{Err: err.Error()}
		case <-done:
			done = nil
			ev = agentcore.Canceled{}
			if st := signals.StoppedBy(ctx); st != nil { // the first SIGINT or SIGTERM (signals/stop.go)
				ev = agentcore.Signaled{Sig: st.Sig}
			}
		}
		if ev == nil {
			continue
		}
		if f := a.feed(ev); f != nil {
			return *f, lost
		}
		if a.m.Stopping() == 0 {
			a.setPhase(ctx, a.phase(time.Now(), coordAddr))
		}
	}
}

// fromCoordinator turns the coordinator's event into the machine's; nil
// for what the shell handles alone (a hang verdict's evidence request).
func (a *agent) fromCoordinator(ev *gotrainv1.GenerationEvent) agentcore.Event {
	switch e := ev.Event.(type) {
	case *gotrainv1.GenerationEvent_Started:
		g := e.Started
		if a.gen == nil {
			close(a.started)             // waitForStart says no more
			if a.cfg.Coordinator != "" { // joined another node's (or a standalone) coordinator
				fmt.Fprintln(a.cfg.Stderr, explain.JoinedLine(a.cfg.RunID, a.host, g)) // explain/restartline.go
			}
		}
		program := pystandby.IsPython(a.cfg.Program) && a.torchDir() != ""
		if unfinished := a.recov.generationStarted(time.Now(), g.GetGeneration(), program); unfinished != nil && len(unfinished.Ranks) > 0 {
			a.reportRecovery(recovery.Decide(*unfinished)) // recoveries.go: a restart that did not get as far as its first step
		}
		if line := explain.SizeLine(a.gen, g); line != "" { // explain/restartline.go: an elastic job shrank or grew
			fmt.Fprintln(a.cfg.Stderr, line)
		}
		a.gen, a.lastEnded = g, nil
		a.snapPeers.Generation(snaptier.GenerationOf(g), a.snapPeerAddr)
		a.log.Info("generation started", "generation", g.GetGeneration(), "world_size", g.GetWorldSize(), "ranks", len(g.GetRanks()))
		// RAS-derived progress spans the job's communicators (observe/raspoll.go).
		a.hub.RAS().Generation(g.GetGeneration(), int(g.GetWorldSize()))
		return agentcore.GenerationStarted{Gen: genwire.Generation(g)}
	case *gotrainv1.GenerationEvent_Ended:
		a.log.Info("generation ended", "generation", e.Ended.GetGeneration(), "reason", e.Ended.GetReason())
		a.lastEnded = e.Ended
		a.recov.generationEnded(time.Now())
		var replace []int
		for _, r := range e.Ended.GetReplace() {
			replace = append(replace, int(r))
		}
		if len(replace) > 0 {
			// A replacement is not a restart: no RestartPlanned line follows,
			// so this is the line a person reads on every node.
			fmt.Fprintf(a.cfg.Stderr, "gotrain: generation %d ended: %s\n", e.Ended.GetGeneration(), e.Ended.GetReason())
		}
		return agentcore.GenerationEnded{Generation: e.Ended.GetGeneration(), Reason: e.Ended.GetReason(), Replace: replace}
	case *gotrainv1.GenerationEvent_Restarting:
		fmt.Fprintln(a.cfg.Stderr, explain.RestartLine(e.Restarting)) // explain/restartline.go
	case *gotrainv1.GenerationEvent_Evidence:
		a.onHang(e.Evidence) // report.go
	case *gotrainv1.GenerationEvent_Finished:
		a.finished = e.Finished
		return agentcore.JobFinished{Succeeded: e.Finished.GetSucceeded(), ExitCode: exitCodeOf(e.Finished)}
	}
	return nil
}

// feed steps the machine with ev and carries out its actions; the events
// an action causes (a process started, a hand-over failed) are fed at once,
// before the next action. It returns the machine's Finish, nil until then.
func (a *agent) feed(ev agentcore.Event) *agentcore.Finish {
	if ex, ok := ev.(agentcore.Exited); ok {
		// Its exit is decided on: the process is the machine's no more,
		// once the actions (its report) are carried out.
		defer a.reg.exited(ex.Proc)
		if p := a.reg.get(ex.Proc); p != nil && !p.who.Standby {
			a.recov.exited(time.Now())
		}
	}
	f, err := agentcore.Drive(a.m, time.Now, ev, func(_ int, act agentcore.Action) []agentcore.Event {
		if _, ok := act.(agentcore.Finish); ok {
			return nil // the caller ends the agent
		}
		return a.do(act)
	})
	if err != nil {
		a.log.Error("agent machine", "err", err)
	}
	return f
}

// workerEnv is the environment of a worker or standby process: the base
// environment without gotrain's variables, then vars (gotrain's), PyTorch's
// flight recorder settings, and the GPUs' variables (placement.WorkerGPUEnv) when
// gpus is not empty.
func (a *agent) workerEnv(vars []string, gpus []int) []string {
	env := append(jobenv.Strip(a.cfg.Env), vars...)
	env = append(env, workerenv.TorchDebugEnv(a.cfg.Env, a.cfg.LogDir)...)
	if a.hub != nil && a.hub.Torch() != nil {
		env = append(env, torchhook.EnvDir+"="+a.hub.Torch().Dir()) // observe/torchprogress.go
	}
	env = snaptier.PythonPath(env, a.pyPath)
	if a.cfg.Role != "" {
		env = append(env, "ROLE_NAME="+a.cfg.Role) // the last of a name wins
	}
	if len(gpus) > 0 {
		env = append(env, placement.WorkerGPUEnv(gpus)...)
		env = append(env, placement.MultiRankEnv(a.cfg.Env, a.cfg.RanksPerGPU)...)
	}
	return env
}

// finish turns the coordinator's verdict into this agent's result.
func (a *agent) finish(f *gotrainv1.JobFinished) error {
	if f.GetSucceeded() {
		return nil
	}
	return &ExitError{Code: exitCodeOf(f), Message: explain.DescribeFailure(f)}
}

func exitCodeOf(f *gotrainv1.JobFinished) int {
	if c := int(f.GetExitCode()); c > 0 && c < 256 {
		return c
	}
	return 1
}

// ExitCode is the status `gotrain launch` exits with.
func (e *ExitError) ExitCode() int { return e.Code }
