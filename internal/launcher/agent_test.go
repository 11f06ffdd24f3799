package launcher

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/gotrain/gotrain/internal/launcher/signals"
	"github.com/gotrain/gotrain/internal/testing/testkit"
)

// Every goroutine the agent starts (its subsystems, the embedded
// coordinator, the processes' watchers) has ended when Run returns.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// gRPC's resolver and balancer goroutines wind down asynchronously
		// after a ClientConn closes, and grpc-go starts one global
		// callback serializer per process.
		goleak.IgnoreAnyFunction("google.golang.org/grpc/internal/grpcsync.(*CallbackSerializer).run"),
		goleak.IgnoreAnyFunction("google.golang.org/grpc/internal/resolver/dns.(*dnsResolver).watcher"),
	)
}

// agentConfig is a one-node CPU job of n ranks running sh -c script.
func agentConfig(t *testing.T, n int, script string) (Config, *testkit.Buffer) {
	t.Helper()
	out := &testkit.Buffer{}
	cfg := Config{NprocPerNode: n, Backend: "cpu", Program: "/bin/sh", Args: []string{"-c", script},
		Env: os.Environ(), Stdout: out, Stderr: out, Logger: slog.New(slog.DiscardHandler), GracePeriod: 2 * time.Second}
	cfg.MaxRestarts = 0
	return cfg, out
}

// A job whose ranks all succeed returns nil, with their output prefixed.
func TestAgentRunsAJobToSuccess(t *testing.T) {
	cfg, out := agentConfig(t, 2, `echo "hello from $RANK of $WORLD_SIZE"`)
	if err := Run(t.Context(), cfg); err != nil {
		t.Fatalf("Run: %v\n%s", err, out)
	}
	for _, want := range []string{"[rank 0] hello from 0 of 2", "[rank 1] hello from 1 of 2"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}

// A rank that fails is restarted while --max-restarts allows, with the
// restart count in its environment; then the job fails with its status and
// the report names it.
func TestAgentRestartsThenFailsWithTheRanksStatus(t *testing.T) {
	cfg, out := agentConfig(t, 2, `echo "restart $TORCHELASTIC_RESTART_COUNT"; [ "$RANK" = 1 ] && exit 7; sleep 30`)
	cfg.MaxRestarts = 1
	err := Run(t.Context(), cfg)
	var ee *ExitError
	if !errors.As(err, &ee) || ee.Code != 7 || !strings.Contains(ee.Message, "rank 1") {
		t.Fatalf("Run = %v; want exit 7 naming rank 1\n%s", err, out)
	}
	if !strings.Contains(out.String(), "[rank 1] restart 1") {
		t.Errorf("rank 1 was not restarted with TORCHELASTIC_RESTART_COUNT=1:\n%s", out)
	}
}

// SIGTERM to the agent stops the workers (they get it) and the agent exits
// 128+15 once they are gone, saying what it was doing.
func TestAgentStopsOnSIGTERM(t *testing.T) {
	cfg, out := agentConfig(t, 2, `trap 'echo got TERM; exit 0' TERM; echo ready; while :; do sleep 0.1; done`)
	sigs := make(chan os.Signal, 1)
	cfg.Signals = sigs
	done := make(chan error, 1)
	go func() { done <- Run(t.Context(), cfg) }()
	testkit.WaitFor(t, time.Minute, "both ready lines", func() bool { return strings.Count(out.String(), "ready") == 2 })
	sigs <- syscall.SIGTERM
	err := <-done
	var st *signals.Stopped
	if !errors.As(err, &st) || st.ExitCode() != 128+15 || st.Phase != "running generation 0" {
		t.Fatalf("Run = %v; want a stop by SIGTERM (exit 143) while running generation 0\n%s", err, out)
	}
	if strings.Count(out.String(), "got TERM") != 2 {
		t.Errorf("the workers did not get SIGTERM:\n%s", out)
	}
}

// The agent's context ending stops the workers and returns its error.
func TestAgentStopsWhenCanceled(t *testing.T) {
	cfg, out := agentConfig(t, 1, `echo ready; exec sleep 60`)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- Run(ctx, cfg) }()
	testkit.WaitFor(t, time.Minute, "the ready line", func() bool { return strings.Contains(out.String(), "ready") })
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("Run = %v; want context.Canceled\n%s", err, out)
	}
}

// TestSupersededStreamIsABlip: a watch stream that the coordinator ends
// because the node opened a newer one (ALREADY_EXISTS) is no end of
// contact; a lost node (Aborted) and the job's end are.
func TestSupersededStreamIsABlip(t *testing.T) {
	for _, c := range []struct {
		err   error
		final bool
	}{
		{status.Error(codes.AlreadyExists, `superseded: node "node-3" opened a newer watch stream`), false},
		{status.Error(codes.Unavailable, "connection reset"), false},
		{status.Error(codes.Aborted, "this node was lost"), true},
		{io.EOF, true},
	} {
		if got := final(c.err); got != c.final {
			t.Errorf("final(%v) = %v, want %v", c.err, got, c.final)
		}
	}
}

// Each worker's arguments get its own local rank, as under torchrun.
func TestAgentLocalRankInArgs(t *testing.T) {
	cfg, out := agentConfig(t, 2, `echo "rank $RANK args $1 $2 $3"`)
	cfg.Args = append(cfg.Args, "sh", "--local-rank=${local_rank}", "$local_rank.log", "${local_rank}")
	if err := Run(t.Context(), cfg); err != nil {
		t.Fatalf("Run: %v\n%s", err, out)
	}
	for _, want := range []string{"[rank 0] rank 0 args --local-rank=0 0.log 0", "[rank 1] rank 1 args --local-rank=1 1.log 1"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}
