package launcher

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/gotrain/gotrain/internal/jobenv"
	gotrainv1 "github.com/gotrain/gotrain/proto/gotrain/v1"
)

// Hot standbys (gotrain launch --standby), the agent's half; package worker
// has the other (worker/standby.go), and standbypool.go the bookkeeping.
//
// Once a generation runs, the agent starts per local slot one spare process
// of the worker program, bound to the slot's GPU (found in the node's CUDA_VISIBLE_DEVICES list),
// with GOTRAIN_STANDBY=1 and the job-wide variables but no rank. Its
// worker.Init prewarms the GPU, attaches with hello{standby} and waits. When
// a later generation needs a new process for a rank (every rank after a
// process restart; the dead ranks after an in-process recovery), the agent
// hands the rank to the slot's ready standby over its stream
// (StandbyAssignment: the rank's variables) instead of starting a process,
// and starts a new standby for next time. From then on the process is that
// rank's worker: its output is "[rank R]" (it was "[standby N]"), its log
// file rankR.log (the lines it printed before are written there first), and
// its exit is that rank's. An unassigned standby's exit is logged and it is
// replaced; it never fails the job. Unassigned standbys are SIGKILLed (whole
// process group) when the job ends or is stopped.
//
// The program must use package worker: a standby that exits, or stays
// silent for --standby-timeout, without saying hello turns standbys off
// with one warning, and ranks start new processes as without --standby.

// StandbyMode says when the agent keeps hot standbys.
type StandbyMode string

const (
	// StandbyOff: never ("" is the same).
	StandbyOff StandbyMode = "off"
	// StandbyOn: from the first generation on (any backend).
	StandbyOn StandbyMode = "on"
	// StandbyAuto: on the NCCL backend, once every worker of the current
	// generation on this node has attached with package worker (said
	// hello): the program then supports standbys, and a spare's warm CUDA
	// context and NCCL (~0.3 s of a restart) pays off. Programs that do not
	// use package worker (PyTorch) never attach, so never get a spare.
	StandbyAuto StandbyMode = "auto"
)

// ParseStandbyMode reads --standby's value: on, off or auto (true and false
// too, for the bare flag).
func ParseStandbyMode(s string) (StandbyMode, error) {
	switch s {
	case "on", "true":
		return StandbyOn, nil
	case "off", "false":
		return StandbyOff, nil
	case "auto":
		return StandbyAuto, nil
	}
	return "", fmt.Errorf("--standby %q: want on, off or auto", s)
}

// enabled says whether the agent keeps a standby pool at all on backend.
func (m StandbyMode) enabled(backend string) bool {
	return m == StandbyOn || (m == StandbyAuto && backend == "nccl")
}

// standbyTick is how often the agent checks for standbys that never said
// hello.
const standbyTick = 100 * time.Millisecond

// standbys is the agent's pool of hot standbys, shared by the agent's loop,
// the relay's Attach streams and the processes' starters.
type standbys struct {
	mu   sync.Mutex
	pool *standbyPool
	log  *slog.Logger
	warn io.Writer // where the user reads warnings
	// waitAttach (StandbyAuto): no standby starts until every worker of a
	// generation has attached; the agent's loop clears it
	// (workersAttached). Owned by the agent's loop.
	waitAttach bool
}

// startStandbys turns the pool on (--standby on, or auto on the NCCL
// backend) and returns the function
// that kills every unassigned standby and waits for them, for the end of
// the job.
func (a *agent) startStandbys(ctx context.Context) (stop func()) {
	if !a.cfg.Standby.enabled(a.cfg.Backend) {
		return func() {}
	}
	a.sb = &standbys{pool: newStandbyPool(a.cfg.StandbyTimeout), log: a.log.With("component", "standby"), warn: a.cfg.Stderr,
		waitAttach: a.cfg.Standby == StandbyAuto}
	tctx, cancel := context.WithCancel(ctx)
	tickDone := make(chan struct{})
	go func() {
		defer close(tickDone)
		t := time.NewTicker(standbyTick)
		defer t.Stop()
		for {
			select {
			case <-tctx.Done():
				return
			case now := <-t.C:
				a.sb.mu.Lock()
				kill, warn := a.sb.pool.tick(now)
				a.sb.mu.Unlock()
				a.sb.kill(kill, warn)
			}
		}
	}()
	return func() {
		cancel()
		<-tickDone
		a.sb.mu.Lock()
		kill := a.sb.pool.close()
		a.sb.mu.Unlock()
		a.sb.kill(kill, "")
		for _, p := range kill {
			<-p.done
		}
	}
}

// kill SIGKILLs the process groups of standbys the pool let go, and prints
// warn when there is one.
func (s *standbys) kill(procs []*workerProc, warn string) {
	if warn != "" {
		fmt.Fprintf(s.warn, "gotrain: warning: %s\n", warn)
	}
	for _, p := range procs {
		s.log.Info("standby stopped", "slot", p.spec.slot, "pid", p.pid())
		p.signal(syscall.SIGKILL)
	}
}

// replenishStandbys starts, in the background, a standby for every local
// slot of generation g that has none.
func (a *agent) replenishStandbys(g *gotrainv1.GenerationStarted) {
	if a.sb == nil || a.stopping != 0 || a.sb.waitAttach {
		return
	}
	for _, r := range g.GetRanks() {
		a.startStandby(int(r.GetLocalRank()), int(r.GetGpu()))
	}
}

// startStandby starts a standby for slot on gpu in the background, unless
// the slot has one.
func (a *agent) startStandby(slot, gpu int) {
	a.sb.mu.Lock()
	res := a.sb.pool.reserve(slot, gpu)
	a.sb.mu.Unlock()
	if res == nil {
		return
	}
	vars := jobenv.StandbyVars{Slot: slot, AgentSocket: a.socket, JobToken: a.cfg.JobToken, RunID: a.cfg.RunID,
		Backend: a.cfg.Backend, Host: a.cfg.NodeAddress, GPU: gpu}
	spec := workerSpec{rank: -1, standby: true, slot: slot, program: a.cfg.Program, args: a.cfg.Args, env: a.workerEnv(vars.Environ(), standbyGPUs(gpu, localGPUs(a.gen))), logDir: a.cfg.LogDir, reaper: a.reaper}
	go func() {
		p, err := startWorker(spec, a.stdout, a.stderr)
		a.sb.mu.Lock()
		if err != nil {
			kill, warn := a.sb.pool.startFailed(res, err)
			a.sb.mu.Unlock()
			a.sb.kill(kill, warn)
			return
		}
		kill := a.sb.pool.started(res, p, time.Now())
		a.sb.mu.Unlock()
		go func() { <-p.exited; a.exits <- p }()
		if kill {
			p.signal(syscall.SIGKILL)
			return
		}
		a.place.pin(p.pid(), gpu, a.log)
		a.sb.log.Info("standby started", "slot", slot, "gpu", gpu, "pid", p.pid())
	}()
}

// standbyExited takes the exit of a process that was a standby when it
// ended (the loop's workerExited calls it first); it reports whether p was
// one. An unassigned standby is replaced, never reported to the coordinator.
func (a *agent) standbyExited(p *workerProc) bool {
	if !p.spec.standby {
		return false
	}
	if a.sb == nil {
		return true
	}
	a.sb.mu.Lock()
	res := a.sb.pool.exited(p)
	a.sb.mu.Unlock()
	if !res.known {
		return true // the pool let it go and killed it
	}
	a.sb.log.Warn("standby exited before it was used", "slot", res.slot, "pid", p.pid(), "exit", p.exit.String(), "stderr", p.stderr.snapshot())
	a.sb.kill(nil, res.warn)
	if res.replace && a.stopping == 0 {
		a.startStandby(res.slot, res.gpu)
	}
	return true
}

// fromStandby hands rank r of generation g to its slot's ready standby and
// makes that process the rank's worker. It reports whether it did; if not,
// the caller starts a process as usual.
func (a *agent) fromStandby(g *gotrainv1.GenerationStarted, r *gotrainv1.RankAssignment, vars jobenv.Vars) bool {
	if a.sb == nil || a.stopping != 0 {
		return false
	}
	slot, gpu, rank := int(r.GetLocalRank()), int(r.GetGpu()), int(r.GetRank())
	a.sb.mu.Lock()
	s, stale := a.sb.pool.take(slot, gpu)
	a.sb.mu.Unlock()
	if stale != nil && stale.proc != nil {
		a.sb.log.Info("standby of another GPU stopped", "slot", slot, "gpu", stale.gpu, "pid", stale.proc.pid())
		stale.proc.signal(syscall.SIGKILL)
	}
	if s == nil {
		return false
	}
	p := s.proc
	select {
	case <-p.exited:
		return false // it just died: its exit is on the way
	default:
	}
	a.countUntilReaped(p) // a rank's process now: the job waits for it
	// The hub knows the rank's new pid before the process attaches as it.
	a.hub.started(g.GetGeneration(), rank, p.pid(), gpu)
	msg := &gotrainv1.AgentMessage{Msg: &gotrainv1.AgentMessage_Assign{Assign: &gotrainv1.StandbyAssignment{
		Generation: g, Rank: int32(rank), Env: vars.Environ(),
	}}}
	select {
	case s.send <- msg:
	default:
		// Its stream is stuck (never the case for a ready one): drop it.
		a.sb.log.Warn("standby's stream is full; stopping it", "slot", slot, "pid", p.pid())
		p.signal(syscall.SIGKILL)
		return false
	}
	p.spec.standby, p.spec.rank, p.spec.generation = false, rank, g.GetGeneration()
	var logFile *os.File
	if a.cfg.LogDir != "" {
		f, err := openRankLog(a.cfg.LogDir, rank, g.GetGeneration(), fmt.Sprintf("(standby pid %d)", p.pid()))
		if err != nil {
			fmt.Fprintf(a.cfg.Stderr, "gotrain: warning: %v\n", err)
		}
		logFile = f
	}
	p.out.become(rank, logFile)
	p.evidence = snapshotEvidence(a.oomFile)
	a.workers[rank] = p
	a.log.Info("worker started from standby", "rank", rank, "slot", slot, "pid", p.pid(), "generation", g.GetGeneration())
	return true
}

// standbyAttach serves a standby's Attach stream: it makes the standby ready
// and sends it its assignment when the agent takes it.
func (r *relay) standbyAttach(stream gotrainv1.Agent_AttachServer, hello *gotrainv1.WorkerHello) error {
	sb := r.standby
	if sb == nil {
		return status.Error(codes.FailedPrecondition, "attach: this agent keeps no standbys (gotrain launch --standby)")
	}
	slot, pid := int(hello.GetStandbySlot()), int(hello.GetPid())
	send := make(chan *gotrainv1.AgentMessage, 1)
	sb.mu.Lock()
	err := sb.pool.hello(slot, pid, send)
	sb.mu.Unlock()
	if err != nil {
		return status.Errorf(codes.FailedPrecondition, "attach: %v", err)
	}
	sb.log.Info("standby ready", "slot", slot, "pid", pid)
	recvErr := make(chan error, 1)
	go func() {
		for {
			if _, err := stream.Recv(); err != nil {
				recvErr <- err
				return
			}
		}
	}()
	ctx := stream.Context()
	select {
	case m := <-send:
		if err := stream.Send(m); err != nil {
			return err
		}
		// The worker closes its end once it has the assignment.
		select {
		case <-recvErr:
		case <-ctx.Done():
		}
		return nil
	case err := <-recvErr:
		sb.mu.Lock()
		sb.pool.detached(slot, pid, send)
		sb.mu.Unlock()
		if errors.Is(err, io.EOF) {
			return nil
		}
		return err
	case <-ctx.Done():
		sb.mu.Lock()
		sb.pool.detached(slot, pid, send)
		sb.mu.Unlock()
		return ctx.Err()
	}
}

// workersAttached runs in the agent's loop when a worker attached: with
// StandbyAuto, once every worker of the current generation on this node
// has, the program is known to use package worker and the standbys start.
func (a *agent) workersAttached() {
	if a.sb == nil || !a.sb.waitAttach || a.gen == nil || !a.hub.allAttached(a.gen.GetGeneration(), len(a.gen.GetRanks())) {
		return
	}
	a.sb.waitAttach = false
	a.log.Info("every worker attached with package worker: starting hot standbys (--standby auto)")
	a.replenishStandbys(a.gen)
}

// standbyGPUs is what a standby for a slot on gpu sees: the node's GPUs of
// the job in local-rank order as the workers do (node, from localGPUs),
// when gpu is one of them, so that a rank it takes over can map its
// neighbours' memory (worker/pairreduce); else that GPU alone. Package
// worker finds its own GPU in the list. Nothing for a CPU slot.
func standbyGPUs(gpu int, node []int) []int {
	switch {
	case gpu < 0:
		return nil
	case slices.Contains(node, gpu):
		return node
	}
	return []int{gpu}
}
