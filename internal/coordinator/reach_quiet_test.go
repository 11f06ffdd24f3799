package coordinator

import (
	"context"
	"github.com/gotrain/gotrain/internal/coordinator/job"
	"log/slog"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/gotrain/gotrain/internal/testing/testkit"
	gotrainv1 "github.com/gotrain/gotrain/proto/gotrain/v1"
)

// A one-node job's agent that goes away (Ctrl-C: its stream ends) is no
// warning; a node of several that does is.
func TestOneNodeStreamEndIsNoWarning(t *testing.T) {
	for _, tc := range []struct {
		nodes int
		level string
	}{{1, "level=INFO"}, {2, "level=WARN"}} {
		logs := &testkit.Buffer{}
		_, addr := startBounded(t, Config{Job: job.Config{Nodes: tc.nodes, NodeTimeout: time.Minute}}, func(s *Server) {
			s.log = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
		})
		var agents []*agent
		for i := range tc.nodes {
			agents = append(agents, join(t, newClient(t, addr), "host-"+string(rune('a'+i)), "10.0.0.1", 1, 2222))
		}
		ctx, cancel := context.WithCancel(rpcCtx(t))
		var streams []grpc.ServerStreamingClient[gotrainv1.GenerationEvent]
		for i, a := range agents { // all attach: the job starts once they have
			if i == 0 {
				streams = append(streams, a.watch(ctx)) // the one that goes away
			} else {
				streams = append(streams, a.watch(rpcCtx(t)))
			}
		}
		for _, s := range streams {
			if _, err := s.Recv(); err != nil { // started
				t.Fatal(err)
			}
		}
		cancel()
		var line string
		deadline := time.Now().Add(rpcTimeout)
		for line == "" && time.Now().Before(deadline) {
			for _, l := range strings.Split(logs.String(), "\n") {
				if strings.Contains(l, `msg="node unreachable"`) {
					line = l
				}
			}
			time.Sleep(10 * time.Millisecond)
		}
		if !strings.Contains(line, tc.level) {
			t.Errorf("--nnodes %d: the stream's end logs %q, want %s", tc.nodes, line, tc.level)
		}
	}
}
