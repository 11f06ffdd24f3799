package slurm

import (
	"context"
	"errors"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gotrain/gotrain/internal/launcher"
	"github.com/gotrain/gotrain/internal/launcher/signals"
)

// calledMunge is a fakeMunge that says when it is first used.
type calledMunge struct {
	fakeMunge
	called chan struct{}
}

func (m *calledMunge) Encode(ctx context.Context, payload string, restrict int) (string, error) {
	select {
	case m.called <- struct{}{}:
	default:
	}
	return m.fakeMunge.Encode(ctx, payload, restrict)
}

// A joining node waits for node 0's token exchange (here never up, as when
// node 0 starts late); SIGTERM ends the wait at once, naming it, and the
// agent never runs.
func TestSignalEndsTheWaitForTheToken(t *testing.T) {
	s := &Step{JobID: 23, StepID: 2, Nodes: []string{"127.0.0.1", "127.0.0.2"}, NodeID: 1, TasksOnNode: 1}
	sigs := make(chan os.Signal, 1)
	ctx, forwarded, stop := signals.StopOnSignal(t.Context(), sigs)
	defer stop()
	m := &calledMunge{fakeMunge: fakeMunge{uid: 1000, used: map[string]bool{}}, called: make(chan struct{}, 1)}
	cfg := launcher.Config{Coordinator: "127.0.0.1:1", JoinTimeout: time.Hour, Signals: forwarded}
	done := make(chan error, 1)
	go func() {
		done <- s.Run(ctx, cfg, Env{UID: 1000, Munge: m}, func(context.Context, launcher.Config) error { return errors.New("the agent ran") })
	}()
	<-m.called // Fetch is trying
	sent := time.Now()
	sigs <- syscall.SIGTERM
	err := <-done
	var st *signals.Stopped
	if !errors.As(err, &st) || st.ExitCode() != 143 || !strings.HasPrefix(st.Phase, "waiting for the job token from node 0 (127.0.0.1:") {
		t.Fatalf("Run = %v; want a stop by SIGTERM while waiting for the job token", err)
	}
	t.Logf("%v (after %s)", err, time.Since(sent))
}
