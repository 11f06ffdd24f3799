package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/gotrain/gotrain/internal/coordinator/host"
	"github.com/gotrain/gotrain/internal/jobenv"
	"github.com/gotrain/gotrain/internal/launcher"
	"github.com/gotrain/gotrain/internal/launcher/signals"
	"github.com/gotrain/gotrain/internal/runfile"
)

type coordinatorCmd struct{}

func (*coordinatorCmd) name() string     { return "coordinator" }
func (*coordinatorCmd) synopsis() string { return "run a standalone job coordinator for a cluster" }

const coordinatorUsage = `
Usage: gotrain coordinator [flags]

Runs the job's coordinator on its own, for clusters where no node should hold
it. Start an agent on every node with:
  gotrain launch --nnodes N --coordinator THIS_HOST:PORT --ca-hash sha256:HEX -- ./train
with GOTRAIN_JOB_TOKEN set on every node (the hash is printed when it starts;
the token never is: a token made here is written to a file only you can read).
It exits when the job finishes, with the job's exit status; when not every
node has joined within --rendezvous-timeout, the job fails and it exits 1.
SIGINT or SIGTERM stops it at once (exit 130 or 143), saying what it was
waiting for.

Replicated (no single point of failure): run it on three hosts with the same
--peers and token, each with --listen set to its own entry:
  gotrain coordinator --peers A1,A2,A3 --listen A1 --nnodes N ...   (on A1; A2, A3 alike)
and start the agents with --coordinator A1,A2,A3 (any one is enough). The
replicas elect a leader (Raft, at each --listen port + 3; gossip at + 1); losing
one of three — or the leader — changes nothing for the job.

The job-wide flags (--nnodes, --max-restarts, --restart-backoff,
--hang-timeout, --on-hang, --on-straggler, --rendezvous-timeout, ...) are
those of gotrain launch, with the same defaults: --max-restarts 3 (0 turns
restarts off). They are given here; an agent that joins with a different
--nnodes, --max-restarts, --on-hang or --on-straggler is refused, and a
different timing (--hang-timeout, --restart-backoff, --straggler-persist,
--rendezvous-timeout) gets a warning.

Examples:
  gotrain coordinator --nnodes 4 --listen 0.0.0.0:29400
  gotrain coordinator --nnodes 4 --max-restarts 5 --metrics-addr 0.0.0.0:9400
  gotrain coordinator --peers a1:29400,a2:29400,a3:29400 --listen a1:29400 --nnodes 8 --job-token-file TOKEN_FILE
`

// coordinatorFlags are gotrain coordinator's flags: the job-wide ones that
// gotrain launch has too (host.RegisterJobFlags), and where it listens.
func coordinatorFlags(cfg *host.Config, logFormat *string) *flag.FlagSet {
	fs := newFlagSet("coordinator", coordinatorUsage)
	setGroupedUsage(fs, coordinatorUsage, coordinatorGroups, "") // help.go
	*cfg = host.DefaultConfig()
	host.RegisterJobFlags(fs, &cfg.JobSettings, os.Getenv(jobenv.JobToken))
	registerJobTokenFile(fs) // jobtoken.go
	fs.StringVar(&cfg.Listen, "listen", cfg.Listen, "address to serve gRPC on")
	serverTLSFlags(fs, &cfg.TLSCert, &cfg.TLSKey) // tlsflags.go
	fs.Func("peers", "the replica set of a replicated coordinator: HOST:PORT of each replica, comma-separated (3 or 5), the same list on every replica; --listen names this one", func(v string) error {
		cfg.Peers = nil
		for _, p := range strings.Split(v, ",") {
			if p = strings.TrimSpace(p); p == "" {
				return errors.New("an empty entry: give each replica's HOST:PORT, separated by single commas")
			}
			cfg.Peers = append(cfg.Peers, p)
		}
		return nil
	})
	fs.Var(logFormatFlag{logFormat}, "log-format", "how the log lines look: people (one \"gotrain: …\" line each), logfmt (time=… level=… msg=… key=value; the default, for tools), json (one object per line, for log collectors)")
	fs.IntVar(&cfg.GossipPort, "gossip-port", cfg.GossipPort, "with --nnodes > 1: gossip (memberlist, UDP+TCP) port agents join to report dead nodes in seconds (default: the --listen port + 1; 0: any free port)")
	return fs
}

func (c *coordinatorCmd) run(ctx context.Context, args []string) error {
	if err := keepMemoryPrivate(); err != nil { // nodump.go: before the token and keys are read
		return err
	}
	var cfg host.Config
	var logFormat string
	fs := coordinatorFlags(&cfg, &logFormat)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if err := applyJobToken(fs, &cfg.JobSettings, os.Stderr); err != nil { // jobtoken.go
		return err
	}
	replicated, err := checkCoordinatorFlags(fs, &cfg)
	if err != nil {
		return err
	}
	cfg.AdvertiseAddr = launcher.OutboundAddress
	cfg.Logger = newLogger(os.Stderr, logFormat, logLogfmt, slog.LevelInfo)

	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sigs)
	ctx, _, stop := signals.StopOnSignal(ctx, sigs) // its cause says what the coordinator waited for
	defer stop()
	tokenMade := cfg.JobToken == ""
	coord, err := host.Start(ctx, cfg)
	if err != nil {
		return settingsUsageError(err)
	}
	defer coord.Stop()
	cfg = coord.Config() // the token and run id, made when not given
	tok := "with " + jobenv.JobToken + " set to the job token given here"
	if tokenMade {
		f, err := runfile.WriteToken(cfg.RunID, cfg.JobToken)
		if err != nil {
			return fmt.Errorf("keep the job token for the agents: %w (or set %s)", err, jobenv.JobToken)
		}
		defer f.Remove()
		tok = fmt.Sprintf("with %s=$(cat %s): the job token is in that file (mode 0600), copy it to each node", jobenv.JobToken, f.Path())
	}
	announceCoordinator(coord, cfg, replicated, tok)
	return waitCoordinator(ctx, coord, cfg)
}

// checkCoordinatorFlags checks the parsed flags in fs and cfg, and
// returns whether the coordinator is replicated (--peers given).
func checkCoordinatorFlags(fs *flag.FlagSet, cfg *host.Config) (replicated bool, err error) {
	if fs.NArg() > 0 {
		return false, &usageError{msg: fmt.Sprintf("unexpected argument %q", fs.Arg(0))}
	}
	if err := cfg.JobSettings.Validate(); err != nil {
		return false, settingsUsageError(err)
	}
	if err := checkCoordinatorListen(cfg); err != nil {
		return false, err
	}
	fs.Visit(func(f *flag.Flag) { replicated = replicated || f.Name == "peers" })
	fs.Visit(func(f *flag.Flag) {
		if f.Name == host.FlagReplicas {
			err = &usageError{msg: "--" + host.FlagReplicas + " is for the coordinator embedded in gotrain launch", hint: "Run standalone replicas with --peers A1,A2,A3 on each of the three hosts."}
		}
	})
	if err != nil {
		return false, err
	}
	if replicated && cfg.JobToken == "" {
		return false, &usageError{msg: "--peers without a job token", hint: "Every replica needs the same token: set " + jobenv.JobToken + " (or --" + FlagJobTokenFile + ") to the same secret on each, e.g. from `head -c 32 /dev/urandom | base64`."}
	}
	return replicated, nil
}

// checkCoordinatorListen checks the ports and addresses of cfg and its
// TLS files.
func checkCoordinatorListen(cfg *host.Config) error {
	if cfg.GossipPort != host.GossipPortFromListen {
		if err := checkPort("--gossip-port", cfg.GossipPort); err != nil {
			return err
		}
	}
	if err := checkHostPort("--listen", cfg.Listen, false); err != nil {
		return err
	}
	if err := checkHostPort("--metrics-addr", cfg.MetricsAddr, false); err != nil {
		return err
	}
	for _, p := range cfg.Peers {
		if err := checkHostPort("--peers", p, true); err != nil {
			return err
		}
	}
	return checkServerTLS(cfg.TLSCert, cfg.TLSKey) // validate.go
}

// announceCoordinator says on stderr where coord serves and how to start
// the agents; tok says how they get the job token.
func announceCoordinator(coord *host.Coordinator, cfg host.Config, replicated bool, tok string) {
	join := coord.JoinAddr("THIS_HOST")
	if replicated {
		join = strings.Join(cfg.Peers, ",")
		fmt.Fprintf(os.Stderr, "gotrain coordinator: replica %s of %s (Raft at %s)\n", coord.ReplicaID(), join, coord.RaftAddr())
	}
	fmt.Fprintf(os.Stderr, "gotrain coordinator: run %s serving on %s for %d node(s); start an agent on every node with: gotrain launch --nnodes %d --coordinator %s %s ... (%s; it is never printed)\n",
		cfg.RunID, coord.Addr(), cfg.Nodes, cfg.Nodes, join, host.VerifyFlags(coord.CAHash()), tok)
	if addr := coord.MetricsAddr(); addr != "" {
		fmt.Fprintf(os.Stderr, "gotrain coordinator: metrics at http://%s/metrics\n", addr)
	}
}

// waitCoordinator waits until the job coord runs is over, a signal
// stopped it, or it has had no leader for too long, and returns the
// coordinator's result.
func waitCoordinator(ctx context.Context, coord *host.Coordinator, cfg host.Config) error {
	// A replica left without a majority cannot act; the agents stop their
	// workers after their node timeout, and it stops too, saying why.
	leaderless := time.NewTicker(time.Second)
	defer leaderless.Stop()
	giveUp := max(2*cfg.NodeTimeout, 30*time.Second)
	for {
		if phase := coordinatorPhase(coord); signals.SetPhase(ctx, phase) {
			cfg.Logger.Info("phase", "phase", phase)
		}
		select {
		case <-leaderless.C:
			if d := coord.Leaderless(); d > giveUp {
				_ = coord.Stop()
				return fmt.Errorf("gotrain coordinator: replica %s has had no leader for %s: no majority of --peers %s answers, so the job cannot go on; bring the lost replicas' hosts back and restart the job",
					coord.ReplicaID(), d.Round(time.Second), strings.Join(cfg.Peers, ","))
			}
			continue
		case <-coord.Finished():
			if err := coord.Stop(); err != nil {
				return err
			}
			res := coord.Result()
			if res.GetSucceeded() {
				fmt.Fprintln(os.Stderr, "gotrain coordinator: job succeeded")
				return nil
			}
			return &jobFailed{code: int(res.GetExitCode()), msg: "gotrain coordinator: job failed: " + res.GetMessage()}
		case <-coord.Done(): // a signal, or serving failed
			err := coord.Stop()
			if st := signals.StoppedBy(ctx); st != nil {
				return &jobFailed{code: st.ExitCode(), msg: "gotrain coordinator: " + strings.TrimPrefix(st.Error(), "gotrain: ")}
			}
			return err
		}
	}
}

// coordinatorPhase is what a standalone coordinator waits for now, for the
// message of a signal that stops it.
func coordinatorPhase(c *host.Coordinator) string {
	if d := c.Leaderless(); d > 0 {
		return "waiting for a majority of its --peers to elect a leader"
	}
	st := c.Status()
	switch st.GetState() {
	case "waiting":
		return fmt.Sprintf("waiting for the job's nodes to join (%d of --nnodes %d joined)", len(st.GetNodes()), c.Config().Nodes)
	case "restarting":
		return fmt.Sprintf("waiting for the job's next generation (generation %d ended; --restart-backoff)", st.GetGeneration())
	}
	return fmt.Sprintf("running the job (generation %d)", st.GetGeneration())
}

// settingsUsageError turns a setting that cannot work into a usage error
// (message, then what to do); other errors pass.
func settingsUsageError(err error) error {
	var ce *host.ConfigError
	if errors.As(err, &ce) {
		return &usageError{msg: ce.Msg, hint: ce.Hint}
	}
	return err
}

type jobFailed struct {
	code int
	msg  string
}

func (e *jobFailed) Error() string { return e.msg }
func (e *jobFailed) ExitCode() int {
	if e.code > 0 && e.code < 256 {
		return e.code
	}
	return 1
}
