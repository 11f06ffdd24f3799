package launcher

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"

	"github.com/gotrain/gotrain/internal/jobenv"
	"github.com/gotrain/gotrain/internal/runfile"
	"github.com/gotrain/gotrain/internal/token"
	gotrainv1 "github.com/gotrain/gotrain/proto/gotrain/v1"
)

// ExitError is a job that ended badly: Code is what `gotrain launch` exits with.
type ExitError struct {
	Code    int
	Message string
}

func (e *ExitError) Error() string { return e.Message }

// Run runs the agent until the job finishes. It returns nil when every
// worker succeeded, an *ExitError when the job failed or was stopped by a
// signal, and another error when the agent itself could not do its work.
func Run(ctx context.Context, cfg Config) error {
	if err := cfg.setDefaults(); err != nil {
		return err
	}
	if err := cfg.validate(); err != nil {
		return err
	}
	if prog, err := resolveProgram(cfg.Program); err != nil {
		return err
	} else {
		cfg.Program = prog
	}
	if cfg.LogDir != "" {
		if err := os.MkdirAll(cfg.LogDir, 0o755); err != nil {
			return fmt.Errorf("create log dir: %w", err)
		}
	}
	a := &agent{cfg: cfg, log: cfg.Logger, host: hostname(),
		stdout: &console{w: cfg.Stdout}, stderr: &console{w: cfg.Stderr},
		workers: map[int]*workerProc{}, exits: make(chan *workerProc, 64)}
	a.place = nodePlacement(&a.cfg, a.log)
	a.oomFile = agentMemoryEventsFile()
	return a.run(ctx)
}

// resolveProgram finds the program the way a shell would, so that a typo is
// reported before any coordinator or worker starts.
func resolveProgram(p string) (string, error) {
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
	log    *slog.Logger
	host   string
	stdout *console
	stderr *console

	coord  gotrainv1.CoordinatorClient
	nodeID string
	socket string
	reaper *reaper    // nil without one
	place  *placement // GPUs in NVLink order and their CPUs (placement.go); nil without NVML
	hub    *hub       // the ranks' progress, reported once a second (progress.go)
	// oomFile holds the workers' memory cgroup's oom_kill counter
	// (rootcause.go); "" when there is none.
	oomFile string
	// metricsAddr is where the embedded coordinator serves /metrics; "" if not.
	metricsAddr string
	// joinHint is the command line the other nodes run, printed once this
	// node joined its embedded coordinator; "" for one node or without one.
	joinHint string
	// gossipPort is the coordinator's gossip port from Join; 0: no gossip.
	gossipPort int

	gen      *gotrainv1.GenerationStarted // nil when no generation runs here
	workers  map[int]*workerProc          // by rank, current generation only
	exits    chan *workerProc
	attached chan struct{}  // a worker attached (hub.onAttach); buffered, coalesced
	procs    sync.WaitGroup // every rank's process (spawned or taken from a standby), until reaped
	stopping syscall.Signal // the signal that is stopping the job, 0 if none
	sb       *standbys      // hot standbys (standby.go); nil when they are off
}

func (a *agent) run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	// A private directory for the workers' socket: its mode keeps other users out.
	dir, err := os.MkdirTemp("", "gotrain-agent-")
	if err != nil {
		return fmt.Errorf("create the agent's socket dir: %w", err)
	}
	defer os.RemoveAll(dir)
	a.socket = filepath.Join(dir, "agent.sock")

	if a.reaper, err = startReaper(a.cfg.ReaperCommand); err != nil {
		a.log.Warn("no orphan reaper: processes started by workers may outlive a SIGKILLed agent", "err", err)
	}
	// Deferred before anything that stops workers, so it runs after them.
	defer a.reaper.close()
	// A worker's exit can be known before the kernel has finished with it
	// (exitearly.go): the job ends only once every process is reaped.
	defer a.procs.Wait()

	coordAddr := a.cfg.Coordinator
	if coordAddr == "" {
		addr, stopCoord, err := a.startCoordinator(ctx)
		if err != nil {
			return err
		}
		defer stopCoord()
		coordAddr = addr
	}

	conn, err := grpc.NewClient(coordAddr,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		token.DialOption(a.cfg.JobToken),
		// Pings find a coordinator that vanished without closing the
		// connection (its machine died, the network split).
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 10 * time.Second, Timeout: 10 * time.Second, PermitWithoutStream: true}))
	if err != nil {
		return fmt.Errorf("coordinator address %q: %w", coordAddr, err)
	}
	defer conn.Close()
	a.coord = gotrainv1.NewCoordinatorClient(conn)

	if err := a.join(ctx, coordAddr); err != nil {
		return err
	}
	a.log = a.log.With("node", a.nodeID)
	defer a.startGossip(coordAddr)() // gossip.go
	if a.joinHint != "" {
		// Printed after this node joined, so that it is the first node
		// (node ids break ties in the rank order of nodes on one host).
		fmt.Fprintln(a.cfg.Stderr, a.joinHint)
	}

	lis, err := net.Listen("unix", a.socket)
	if err != nil {
		return fmt.Errorf("listen on the workers' socket: %w", err)
	}
	relaySrv := grpc.NewServer(token.ServerOptions(a.cfg.JobToken)...)
	a.hub = newHub(a.log, a.coord, a.nodeID)
	a.attached = make(chan struct{}, 1)
	a.hub.onAttach = func() {
		select {
		case a.attached <- struct{}{}:
		default: // one pending wake-up is enough
		}
	}
	a.startGPUSampling(ctx) // gpusample.go
	go a.hub.report(ctx)
	a.startRASPoll(ctx) // raspoll.go
	if f, err := runfile.Write(runfile.Job{RunID: a.cfg.RunID, Coordinator: coordAddr, Token: a.cfg.JobToken, Metrics: a.metricsAddr}); err == nil {
		defer f.Remove() // lets `gotrain diagnose` find this job
	} else {
		a.log.Warn("no run file for gotrain diagnose", "err", err)
	}
	stopStandbys := a.startStandbys(ctx) // standby.go
	gotrainv1.RegisterAgentServer(relaySrv, &relay{coord: a.coord, nodeID: a.nodeID, hub: a.hub, standby: a.sb})
	go func() { _ = relaySrv.Serve(lis) }()
	defer relaySrv.Stop()
	defer stopStandbys() // before the relay stops: standbys never see their agent go

	stream, err := a.coord.WatchGenerations(ctx, &gotrainv1.WatchGenerationsRequest{NodeId: a.nodeID})
	if err != nil {
		return fmt.Errorf("watch the coordinator at %s: %w", coordAddr, err)
	}
	events := make(chan *gotrainv1.GenerationEvent)
	streamErr := make(chan error, 1)
	go func() {
		for {
			ev, err := stream.Recv()
			if err != nil {
				streamErr <- err
				return
			}
			select {
			case events <- ev:
			case <-ctx.Done():
				return
			}
		}
	}()
	return a.loop(ctx, events, streamErr, coordAddr)
}

func (a *agent) loop(ctx context.Context, events <-chan *gotrainv1.GenerationEvent, streamErr <-chan error, coordAddr string) error {
	var killTimer <-chan time.Time
	for {
		select {
		case ev := <-events:
			switch e := ev.Event.(type) {
			case *gotrainv1.GenerationEvent_Started:
				a.startGeneration(ctx, e.Started)
			case *gotrainv1.GenerationEvent_Ended:
				a.endGeneration(e.Ended)
			case *gotrainv1.GenerationEvent_Evidence:
				a.onHang(ctx, e.Evidence)
			case *gotrainv1.GenerationEvent_Finished:
				a.stopAll(syscall.SIGTERM)
				a.recordRootCause(e.Finished)
				return a.finish(e.Finished)
			}
		case <-a.attached:
			a.workersAttached() // standby.go
		case p := <-a.exits:
			a.workerExited(ctx, p)
			if a.stopping != 0 && len(a.workers) == 0 {
				return &ExitError{Code: 128 + int(a.stopping), Message: fmt.Sprintf("gotrain: stopped by %s", unix.SignalName(a.stopping))}
			}
		case sig := <-a.cfg.Signals:
			s, _ := sig.(syscall.Signal)
			switch s {
			case syscall.SIGINT, syscall.SIGTERM:
				if a.stopping != 0 {
					// A second Ctrl-C: no more grace.
					a.signalAll(syscall.SIGKILL)
					continue
				}
				a.stopping = s
				fmt.Fprintf(a.cfg.Stderr, "gotrain: %s received: stopping %d worker(s) (SIGKILL in %s; press Ctrl-C again to kill now)\n", unix.SignalName(s), len(a.workers), a.cfg.GracePeriod)
				a.signalAll(s)
				killTimer = time.After(a.cfg.GracePeriod)
				if len(a.workers) == 0 {
					return &ExitError{Code: 128 + int(s), Message: fmt.Sprintf("gotrain: stopped by %s", unix.SignalName(s))}
				}
			default:
				a.signalAll(s)
			}
		case <-killTimer:
			a.signalAll(syscall.SIGKILL)
		case err := <-streamErr:
			if a.stopping != 0 {
				continue // we are leaving anyway
			}
			a.stopAll(syscall.SIGTERM)
			return fmt.Errorf("lost the coordinator at %s: %w; workers on %s were stopped", coordAddr, err, a.host)
		case <-ctx.Done():
			a.stopAll(syscall.SIGTERM)
			return ctx.Err()
		}
	}
}

func (a *agent) startGeneration(ctx context.Context, g *gotrainv1.GenerationStarted) {
	a.gen = g
	a.log.Info("generation started", "generation", g.GetGeneration(), "world_size", g.GetWorldSize(), "ranks", len(g.GetRanks()))
	survivors := a.survivors(g) // recover.go
	gpus := localGPUs(g)
	// RAS-derived progress spans the job's communicators (raspoll.go).
	a.hub.ras.generation(g.GetGeneration(), int(g.GetWorldSize()))
	for _, r := range g.GetRanks() {
		if a.resume(g, r, survivors) {
			continue
		}
		vars := jobenv.Vars{
			Rank: int(r.GetRank()), WorldSize: int(g.GetWorldSize()),
			LocalRank: int(r.GetLocalRank()), LocalWorldSize: len(g.GetRanks()),
			GroupRank: int(g.GetGroupRank()), Generation: g.GetGeneration(),
			RestartCount: int(g.GetRestartCount()),
			AgentSocket:  a.socket, JobToken: a.cfg.JobToken, RunID: a.cfg.RunID,
			Backend: a.cfg.Backend, Host: a.cfg.NodeAddress, GPU: int(r.GetGpu()),
			MasterAddr: g.GetMasterAddr(), MasterPort: int(g.GetMasterPort()),
		}
		if a.fromStandby(g, r, vars) { // standby.go
			continue
		}
		spec := workerSpec{rank: int(r.GetRank()), generation: g.GetGeneration(),
			program: a.cfg.Program, args: a.cfg.Args, env: a.workerEnv(vars.Environ(), gpus), logDir: a.cfg.LogDir, reaper: a.reaper}
		ev := snapshotEvidence(a.oomFile)
		p, err := startWorker(spec, a.stdout, a.stderr)
		if err != nil {
			fmt.Fprintf(a.cfg.Stderr, "gotrain: %v\n", err)
			a.report(ctx, &gotrainv1.ReportWorkerExitRequest{
				Generation: g.GetGeneration(), Rank: r.GetRank(), ExitCode: 127,
				StderrTail: []string{err.Error()},
			})
			continue
		}
		a.place.pin(p.pid(), int(r.GetGpu()), a.log)
		p.evidence = ev
		a.workers[spec.rank] = p
		a.hub.started(g.GetGeneration(), spec.rank, p.pid(), int(r.GetGpu()))
		a.watch(p)
	}
	a.replenishStandbys(g) // standby.go
}

// watch sends p to the loop once its exit is known, and counts it in procs
// until it is reaped. Only the loop's goroutine calls it.
func (a *agent) watch(p *workerProc) {
	a.countUntilReaped(p)
	go func() { <-p.exited; a.exits <- p }()
}

// countUntilReaped counts p in procs until it is reaped. Only the loop's
// goroutine calls it, so no Add races the Wait at the end of run.
func (a *agent) countUntilReaped(p *workerProc) {
	a.procs.Add(1)
	go func() { <-p.done; a.procs.Done() }()
}

// workerEnv is the environment of a worker or standby process: the base
// environment without gotrain's variables, then vars (gotrain's), PyTorch's
// flight recorder settings, and the GPUs' variables (WorkerGPUEnv) when
// gpus is not empty.
func (a *agent) workerEnv(vars []string, gpus []int) []string {
	env := append(jobenv.Strip(a.cfg.Env), vars...)
	env = append(env, torchDebugEnv(a.cfg.Env, a.cfg.LogDir)...)
	if len(gpus) > 0 {
		env = append(env, WorkerGPUEnv(gpus)...)
	}
	return env
}

// localGPUs returns the GPUs of generation g's ranks on this node in
// local-rank order, nil when they have none (the CPU backend).
func localGPUs(g *gotrainv1.GenerationStarted) []int {
	gpus := make([]int, len(g.GetRanks()))
	for _, r := range g.GetRanks() {
		lr := int(r.GetLocalRank())
		if r.GetGpu() < 0 || lr < 0 || lr >= len(gpus) {
			return nil
		}
		gpus[lr] = int(r.GetGpu())
	}
	return gpus
}

// endGeneration stops this node's workers of an ended generation; each
// exit is reported as it happens.
func (a *agent) endGeneration(e *gotrainv1.GenerationEnded) {
	a.log.Info("generation ended", "generation", e.GetGeneration(), "reason", e.GetReason())
	for _, p := range a.workers {
		if p.spec.generation == e.GetGeneration() && !a.park(p, e) {
			a.tellEnded(p, e) // recover.go
			go p.stop(syscall.SIGTERM, a.cfg.GracePeriod)
		}
	}
}

func (a *agent) workerExited(ctx context.Context, p *workerProc) {
	if a.standbyExited(p) { // standby.go
		return
	}
	if a.workers[p.spec.rank] == p {
		delete(a.workers, p.spec.rank)
	}
	if p.exit.ExitCode() != 0 && a.stopping == 0 {
		// early: seen when its output closed while exiting, before wait4
		a.log.Info("worker exited", "rank", p.spec.rank, "pid", p.pid(), "exit", p.exit.String(), "early", p.early)
	}
	if a.stopping != 0 {
		return // the job is being stopped by a signal; nothing to decide
	}
	req := &gotrainv1.ReportWorkerExitRequest{
		Generation: p.spec.generation, Rank: int32(p.spec.rank), Pid: int32(p.pid()),
		ExitCode: int32(p.exit.code), StderrTail: p.stderr.snapshot(),
	}
	if p.exit.signal != 0 {
		req.Signal = unix.SignalName(p.exit.signal)
		req.ExitCode = -1
	}
	if p.exit.code != 0 || p.exit.signal != 0 {
		examineExit(req, p.evidence, p.pid(), p.exit.signal)
	}
	a.hub.exited(p.spec.generation, p.spec.rank)
	a.hub.flush(ctx) // the worker's last progress reaches the coordinator before its exit
	a.report(ctx, req)
}

func (a *agent) report(ctx context.Context, req *gotrainv1.ReportWorkerExitRequest) {
	req.NodeId = a.nodeID
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := a.coord.ReportWorkerExit(rctx, req); err != nil {
		a.log.Warn("report worker exit", "rank", req.GetRank(), "err", err)
	}
}

func (a *agent) signalAll(sig syscall.Signal) {
	for _, p := range a.workers {
		p.signal(sig)
	}
}

// stopAll stops every worker (SIGTERM, grace period, SIGKILL) and waits.
func (a *agent) stopAll(sig syscall.Signal) {
	done := make(chan struct{})
	for _, p := range a.workers {
		go func() { p.stop(sig, a.cfg.GracePeriod); done <- struct{}{} }()
	}
	for range a.workers {
		<-done
	}
	clear(a.workers)
}

// finish turns the coordinator's verdict into this agent's result.
func (a *agent) finish(f *gotrainv1.JobFinished) error {
	if f.GetSucceeded() {
		return nil
	}
	return &ExitError{Code: exitCodeOf(f), Message: describeFailure(f)}
}

func exitCodeOf(f *gotrainv1.JobFinished) int {
	if c := int(f.GetExitCode()); c > 0 && c < 256 {
		return c
	}
	return 1
}

// describeFailure writes the report a person reads when the job failed.
func describeFailure(f *gotrainv1.JobFinished) string {
	var b strings.Builder
	fl := f.GetFailure()
	if fl == nil {
		fmt.Fprintf(&b, "gotrain: job failed: %s", f.GetMessage())
		return b.String()
	}
	if fl.GetReason() != "" && fl.GetNodeId() != "" && fl.GetSignal() == "" && len(fl.GetStderrTail()) == 0 {
		// The whole node went away (the machine's NodeLost), not one worker.
		fmt.Fprintf(&b, "gotrain: job failed: node %s on %s (agent pid %d) was lost: %s", fl.GetNodeId(), fl.GetHostname(), fl.GetPid(), fl.GetReason())
		if m := f.GetMessage(); m != "" {
			fmt.Fprintf(&b, "\n  %s", m)
		}
		return b.String()
	}
	cause := fmt.Sprintf("exit status %d", fl.GetExitCode())
	if fl.GetSignal() != "" {
		cause = "killed by " + fl.GetSignal()
	}
	if fl.GetReason() != "" {
		cause = fl.GetReason()
	}
	fmt.Fprintf(&b, "gotrain: job failed: rank %d on %s (pid %d) failed first: %s", fl.GetRank(), fl.GetHostname(), fl.GetPid(), cause)
	if m := f.GetMessage(); m != "" {
		fmt.Fprintf(&b, "\n  %s", m)
	}
	writeEvidence(&b, fl)
	if tl := fl.GetStderrTail(); len(tl) > 0 {
		fmt.Fprintf(&b, "\n  last %d line(s) of rank %d's stderr:", len(tl), fl.GetRank())
		for _, l := range tl {
			fmt.Fprintf(&b, "\n    %s", l)
		}
	}
	return b.String()
}

// ExitCode is the status `gotrain launch` exits with.
func (e *ExitError) ExitCode() int { return e.Code }
