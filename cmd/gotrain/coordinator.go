package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/gotrain/gotrain/coordinator"
	"github.com/gotrain/gotrain/internal/jobenv"
	"github.com/gotrain/gotrain/internal/token"
)

type coordinatorCmd struct{}

func (*coordinatorCmd) name() string     { return "coordinator" }
func (*coordinatorCmd) synopsis() string { return "run a standalone job coordinator for a cluster" }

const coordinatorUsage = `
Usage: gotrain coordinator [flags]

Runs the job's coordinator on its own, for clusters where no node should hold
it. Start an agent on every node with:
  gotrain launch --nnodes N --coordinator THIS_HOST:PORT --job-token TOKEN -- ./train
It exits when the job finishes, with the job's exit status; when not every
node has joined within --rendezvous-timeout, the job fails and it exits 1.
`

func (c *coordinatorCmd) run(ctx context.Context, args []string) error {
	fs := newFlagSet(c.name(), coordinatorUsage)
	listen := fs.String("listen", "0.0.0.0:29400", "address to serve gRPC on")
	nodes := fs.Int("nnodes", 1, "number of nodes (agents) the job waits for")
	tok := fs.String("job-token", os.Getenv(jobenv.JobToken), "secret agents must present (default $"+jobenv.JobToken+", or a new one, printed)")
	runID := fs.String("run-id", "", "job name (default: derived from the token)")
	maxRestarts := fs.Int("max-restarts", 0, "restart the job this many times after a worker fails")
	hangTimeout := fs.Duration("hang-timeout", 120*time.Second, "declare a hang when no collective completes for this long while a rank waits in one")
	onHang := fs.String("on-hang", "report", "on a hang: report, or restart (end the generation like a failure)")
	metricsAddr := fs.String("metrics-addr", "", "serve Prometheus /metrics on HOST:PORT (e.g. 0.0.0.0:9400); default off")
	restartBackoff := fs.Duration("restart-backoff", 0, "pause between the last worker of a failed generation stopping and the next generation starting")
	rendezvous := fs.Duration("rendezvous-timeout", 10*time.Minute, "fail the job when not every node has joined by then (0: wait forever)")
	gossipPort := fs.Int("gossip-port", -1, "with --nnodes > 1: gossip (memberlist, UDP+TCP) port agents join to report dead nodes in seconds (default: the --listen port + 1; 0: any free port)")
	noGossip := fs.Bool("no-gossip", false, "do not gossip; a dead node is then found by its broken connection only (about 20 s)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return &usageError{msg: fmt.Sprintf("unexpected argument %q", fs.Arg(0))}
	}
	if *tok == "" {
		*tok = token.Generate()
	}
	if *runID == "" {
		*runID = "gotrain-" + (*tok)[:min(8, len(*tok))]
	}
	if *rendezvous < 0 || *restartBackoff < 0 {
		return &usageError{msg: fmt.Sprintf("--rendezvous-timeout %s, --restart-backoff %s", *rendezvous, *restartBackoff), hint: "Give durations of 0 or more."}
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, nil))
	srv, err := coordinator.New(coordinator.Config{RunID: *runID, Token: *tok, Nodes: *nodes, MaxRestarts: *maxRestarts, Logger: logger,
		RestartBackoff: *restartBackoff, HangTimeout: *hangTimeout, OnHang: *onHang, RendezvousTimeout: *rendezvous})
	if err != nil {
		return err
	}
	lis, err := net.Listen("tcp", *listen)
	if err != nil {
		return fmt.Errorf("listen on %s: %w (choose another with --listen)", *listen, err)
	}
	if *nodes > 1 && !*noGossip {
		port := *gossipPort
		if port < 0 {
			port = coordinator.DefaultGossipPort(*listen)
		}
		stopGossip, err := startGossip(srv, lis.Addr().(*net.TCPAddr), port) // gossip.go
		if err != nil {
			return err
		}
		defer stopGossip()
	}
	host := "THIS_HOST"
	if ip := lis.Addr().(*net.TCPAddr).IP; !ip.IsUnspecified() {
		host = ip.String()
	}
	fmt.Fprintf(os.Stderr, "gotrain coordinator: run %s serving on %s for %d node(s); start an agent on every node with: gotrain launch --nnodes %d --coordinator %s --job-token %s ...\n",
		*runID, lis.Addr(), *nodes, *nodes, net.JoinHostPort(host, strconv.Itoa(lis.Addr().(*net.TCPAddr).Port)), *tok)
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	serveErr := make(chan error, 1)
	serveCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() { serveErr <- srv.Serve(serveCtx, lis) }()
	if err := serveMetrics(serveCtx, srv, *metricsAddr); err != nil { // metrics.go
		return err
	}
	select {
	case <-srv.Finished():
		cancel()
		<-serveErr
		res := srv.Result()
		if res.GetSucceeded() {
			fmt.Fprintln(os.Stderr, "gotrain coordinator: job succeeded")
			return nil
		}
		return &jobFailed{code: int(res.GetExitCode()), msg: "gotrain coordinator: job failed: " + res.GetMessage()}
	case err := <-serveErr:
		return err
	}
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
