package slurm

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gotrain/gotrain/internal/jobtls"
	"github.com/gotrain/gotrain/internal/launcher"
	"github.com/gotrain/gotrain/internal/launcher/signals"
	"github.com/gotrain/gotrain/internal/token"
)

// Env is what Run needs of the process: its uid and munge (nil: none).
type Env struct {
	UID   int
	Munge Munge
	Log   *slog.Logger
	// CA, when set, gives node 0's coordinator a job CA made before it
	// starts and has joiners trust it by the hash that came with the token.
	CA CAHooks
	// KillWait is the cluster's KillWait (0: unknown): the workers' grace
	// period is cut to fit in it (FitGrace).
	KillWait time.Duration
}

// CAHooks connect the exchange to the coordinator's TLS.
type CAHooks interface {
	// NewCA gives cfg (node 0's) a job CA and returns its hash.
	NewCA(cfg *launcher.Config) (hash string, err error)
	// TrustCA has cfg (a joiner's) verify the coordinator by hash.
	TrustCA(cfg *launcher.Config, hash string) error
}

// LocalEnv is this process's Env: munge where munge(1) is installed, on
// MungeSocket's socket.
func LocalEnv(getenv func(string) string, log *slog.Logger) Env {
	e := Env{UID: os.Getuid(), Log: log, CA: JobCA{}, KillWait: KillWait(getenv, os.ReadFile)}
	if _, err := exec.LookPath("munge"); err == nil {
		e.Munge = MungeCLI{Socket: MungeSocket(getenv, os.ReadFile)}
	}
	return e
}

// Run runs the node's agent for this task of s (with s nil: just run).
//
// Several tasks of the step on one node (srun --ntasks-per-node=G, one
// task per GPU): the task with SLURM_LOCALID 0 runs the node's agent with
// one worker per task (Apply), and the node's other tasks wait for it and
// exit with its status; they run no program themselves. The world is never
// smaller than the tasks Slurm started: G tasks on N nodes are N·G ranks.
//
// The job token and the coordinator's CA: on several nodes, node 0's agent
// makes a token (unless given one) and a job CA, and the others get both
// over munge (exchange.go): nothing to copy, nothing printed.
//
// Every wait (the token over munge, a task waiting for the node's agent)
// ends with ctx; with ctx of signals.StopOnSignal (gotrain launch's), a
// SIGINT or SIGTERM ends it, and the error is its *signals.Stopped, which
// names the wait.
func (s *Step) Run(ctx context.Context, cfg launcher.Config, env Env, run func(context.Context, launcher.Config) error) error {
	if s == nil {
		return run(ctx, cfg)
	}
	if env.Log == nil {
		env.Log = slog.New(slog.DiscardHandler)
	}
	env.Log.Info(s.Summary(&cfg))
	if grace, note := FitGrace(cfg.GracePeriod, env.KillWait); note != "" {
		cfg.GracePeriod = grace
		if cfg.JobFlagsGiven["grace-period"] {
			env.Log.Warn(note)
		} else {
			env.Log.Info(note)
		}
	}
	if s.LocalID > 0 {
		return s.follow(ctx, cfg)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var followers *followerSet
	if s.TasksOnNode > 1 {
		var err error
		if followers, err = s.lead(ctx); err != nil {
			return err
		}
	}
	err := s.runAgent(ctx, cfg, env, run)
	followers.finish(err)
	return err
}

func (s *Step) runAgent(ctx context.Context, cfg launcher.Config, env Env, run func(context.Context, launcher.Config) error) error {
	cfg.Signals = slurmSignals(ctx, cfg.Signals)
	run = stoppedWins(run)
	if len(s.Nodes) == 1 && cfg.Coordinator == "" {
		return run(ctx, cfg) // nobody to share a token with
	}
	if env.Munge == nil {
		if cfg.JobToken != "" {
			return run(ctx, cfg) // the user's token, the user's way to trust the coordinator
		}
		return errors.New("slurm: no job token and no munge to share one: pass --job-token-file FILE (a 0600 file every node of the step can read) or set GOTRAIN_JOB_TOKEN, and --ca-hash or --tls-ca on the joining nodes")
	}
	switch {
	case cfg.Coordinator == "":
		// This node runs the coordinator: hand its token (and CA) out.
		ln, err := net.Listen("tcp", net.JoinHostPort("0.0.0.0", strconv.Itoa(s.ExchangePort())))
		if err != nil {
			return fmt.Errorf("slurm: the job token exchange of step %s: %w (is another step of the job on port %d?)", s, err, s.ExchangePort())
		}
		if cfg.JobToken == "" {
			cfg.JobToken = token.Generate()
		}
		g := Grant{Token: cfg.JobToken}
		if env.CA != nil {
			if g.CAHash, err = env.CA.NewCA(&cfg); err != nil {
				ln.Close()
				return err
			}
		}
		go Serve(ctx, ln, env.Munge, env.UID, s.String(), g, env.Log)
	default:
		joinTimeout := cfg.JoinTimeout
		if joinTimeout <= 0 {
			joinTimeout = time.Minute
		}
		fctx, cancel := context.WithTimeout(ctx, joinTimeout)
		defer cancel()
		addr := net.JoinHostPort(s.Head(), strconv.Itoa(s.ExchangePort()))
		setPhase(ctx, env.Log, fmt.Sprintf("waiting for the job token from node 0 (%s) over munge", addr))
		g, err := Fetch(fctx, addr, env.Munge, env.UID, s.String())
		if err != nil {
			return signals.StopCause(ctx, fmt.Errorf("slurm: get the job token from node 0 (%s) over munge: %w; or pass --job-token-file and --ca-hash to every node and GOTRAIN_SLURM=off", s.Head(), err))
		}
		if cfg.JobToken == "" {
			cfg.JobToken = g.Token
		}
		if env.CA != nil && g.CAHash != "" {
			if err := env.CA.TrustCA(&cfg, g.CAHash); err != nil {
				return err
			}
		}
	}
	return run(ctx, cfg)
}

// slurmSignals drops the signals that Slurm sends to every process of the
// step itself (scancel --signal, --signal=USR1@T, srun passing on what it
// got): the workers have them already, and the agent passing them on
// would deliver each twice. SIGINT and SIGTERM still reach the agent. So
// under Slurm --signals-to-handle changes nothing: Slurm, not the agent,
// delivers those signals, to every worker.
func slurmSignals(ctx context.Context, in <-chan os.Signal) <-chan os.Signal {
	if in == nil {
		return nil
	}
	out := make(chan os.Signal, 8)
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case sig := <-in:
				switch sig {
				case syscall.SIGUSR1, syscall.SIGUSR2, syscall.SIGHUP, syscall.SIGQUIT, syscall.SIGCONT:
					continue
				}
				select {
				case out <- sig:
				case <-ctx.Done():
					return
				}
			}
		}
	}()
	return out
}

// stopGrace is how long a failed agent waits for Slurm's SIGTERM: scancel
// and a time limit signal every node at about the same time, and a node
// whose agent saw its peers stop first must still end as stopped (143),
// not as failed.
const stopGrace = 2 * time.Second

// stoppedWins makes run's failure a stop by signal when the agent was, or
// is within stopGrace, sent SIGTERM or SIGINT (ctx's of
// signals.StopOnSignal ends then).
func stoppedWins(run func(context.Context, launcher.Config) error) func(context.Context, launcher.Config) error {
	return func(ctx context.Context, cfg launcher.Config) error {
		err := run(ctx, cfg)
		if err == nil || exitCode(err) > 128 {
			return err
		}
		t := time.NewTimer(stopGrace)
		defer t.Stop()
		select {
		case <-ctx.Done():
			if st := signals.StoppedBy(ctx); st != nil {
				return &launcher.ExitError{Code: st.ExitCode(), Message: fmt.Sprintf("gotrain: stopped by %s (Slurm ended the step; %v)", unix.SignalName(st.Sig), err)}
			}
			return err
		case <-t.C:
			return err
		}
	}
}

// setPhase is signals.SetPhase, logged (--verbose) when the phase changes.
func setPhase(ctx context.Context, log *slog.Logger, phase string) {
	if signals.SetPhase(ctx, phase) && log != nil {
		log.Info("phase", "phase", phase)
	}
}

// JobCA is the CAHooks of gotrain's own TLS (internal/jobtls): node 0's
// agent makes the job CA before its coordinator starts, and joiners pin
// its hash, unless the command line chose otherwise (--tls-cert on node 0:
// the site's PKI; --ca-hash, --tls-ca or --insecure-skip-ca-check on a
// joiner).
type JobCA struct{}

var _ CAHooks = JobCA{}

func (JobCA) NewCA(cfg *launcher.Config) (string, error) {
	if cfg.TLSCert != "" {
		return "", nil
	}
	// Random; the nodes that host the coordinator's replicas get it from
	// the coordinator over their node connections.
	ca, err := jobtls.NewCA(cfg.RunID)
	if err != nil {
		return "", err
	}
	cfg.CA = ca
	return ca.Hash(), nil
}

func (JobCA) TrustCA(cfg *launcher.Config, hash string) error {
	if cfg.Trust != (jobtls.Trust{}) {
		return nil
	}
	if err := jobtls.CheckHash(hash); err != nil {
		return fmt.Errorf("slurm: node 0 sent a bad CA hash: %w", err)
	}
	cfg.Trust.CAHash = hash
	return nil
}

// The node's other tasks wait on an abstract unix socket of the node's
// network namespace, named after the step and node: the agent's task
// accepts them and, when the agent is done, writes its exit status to each.

func (s *Step) socketName() string { return fmt.Sprintf("@gotrain-slurm-%s-%d", s, s.NodeID) }

type followerSet struct {
	ln    net.Listener
	conns chan net.Conn
}

func (s *Step) lead(ctx context.Context) (*followerSet, error) {
	ln, err := net.Listen("unix", s.socketName())
	if err != nil {
		return nil, fmt.Errorf("slurm: %d tasks of step %s on this node: listen for them: %w", s.TasksOnNode, s, err)
	}
	f := &followerSet{ln: ln, conns: make(chan net.Conn, s.TasksOnNode)}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			if peerUID(c) != os.Getuid() {
				c.Close()
				continue
			}
			select {
			case f.conns <- c:
			default:
				c.Close()
			}
		}
	}()
	return f, nil
}

// finish tells every follower the agent's exit status.
func (f *followerSet) finish(err error) {
	if f == nil {
		return
	}
	f.ln.Close()
	code := exitCode(err)
	for {
		select {
		case c := <-f.conns:
			fmt.Fprintf(c, "%d\n", code)
			c.Close()
		default:
			return
		}
	}
}

func exitCode(err error) int {
	if err == nil {
		return 0
	}
	var ec interface{ ExitCode() int }
	if errors.As(err, &ec) {
		return ec.ExitCode()
	}
	return 1
}

// follow waits for the node's agent (the task with SLURM_LOCALID 0) and
// returns its exit status; SIGINT or SIGTERM (scancel: ctx's of
// signals.StopOnSignal ends) end the wait at once.
func (s *Step) follow(ctx context.Context, cfg launcher.Config) error {
	setPhase(ctx, cfg.Logger, fmt.Sprintf("waiting for this node's agent (the task with SLURM_LOCALID 0 of step %s) to start", s))
	deadline := time.Now().Add(cfg.JoinTimeout)
	if cfg.JoinTimeout <= 0 {
		deadline = time.Now().Add(time.Minute)
	}
	var conn net.Conn
	for {
		c, err := net.Dial("unix", s.socketName())
		if err == nil && peerUID(c) == os.Getuid() {
			conn = c
			break
		}
		if c != nil {
			c.Close()
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("slurm: task %d of step %s on node %d: the node's agent (SLURM_LOCALID 0) did not show up: %v", s.LocalID, s, s.NodeID, err)
		}
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-time.After(100 * time.Millisecond):
		}
	}
	defer conn.Close()
	setPhase(ctx, cfg.Logger, fmt.Sprintf("waiting for this node's agent (the task with SLURM_LOCALID 0 of step %s) to finish", s))
	status := make(chan int, 1)
	go func() {
		var code int
		if _, err := fmt.Fscan(conn, &code); err != nil {
			code = 1 // the agent's task ended without a word
		}
		status <- code
	}()
	for {
		select {
		case code := <-status:
			if code == 0 {
				return nil
			}
			return &launcher.ExitError{Code: code, Message: ""} // the agent's task says why
		case <-ctx.Done():
			return context.Cause(ctx)
		}
	}
}

func peerUID(c net.Conn) int {
	uc, ok := c.(*net.UnixConn)
	if !ok {
		return -1
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return -1
	}
	uid := -1
	_ = raw.Control(func(fd uintptr) {
		if cred, err := unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED); err == nil {
			uid = int(cred.Uid)
		}
	})
	return uid
}
