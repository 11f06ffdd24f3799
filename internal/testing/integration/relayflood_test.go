package integration

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/gotrain/gotrain/internal/testing/testkit"
)

// One worker's 2500 long polls through its agent once took every stream of
// the agent's connection to the coordinator: when the other rank crashed,
// its exit could not be reported and the job did not restart. The relay
// keeps each worker within a budget now, refusing the rest with
// ResourceExhausted naming the rank, and the agent's own calls go through:
// the crash is restarted and the job finishes.
func TestRelayedPollsLeaveACrashRestartable(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	cmd := gotrainCmd(ctx, t, nil, "launch", "--nproc-per-node", "2", "--backend", "cpu", "--max-restarts", "1", "--standby", "off",
		"--grace-period", "1s", "--", bin.testprog, "flood", "--n", "2500", "--dir", t.TempDir())
	var stdout, stderr testkit.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	out := stdout.String()
	if ctx.Err() != nil {
		t.Fatalf("the job did not finish within 3 minutes: the crash was not restarted\nstdout:\n%s\nstderr:\n%s", out, stderr.String())
	}
	if err != nil {
		t.Fatalf("gotrain launch: %v\nstdout:\n%s\nstderr:\n%s", err, out, stderr.String())
	}
	for _, want := range []string{
		"[rank 1] flood rank=1 crashes",
		"[rank 0] flood rank=0 restart=1 done",
		"[rank 1] flood rank=1 restart=1 done",
		// The refusal names the rank, its host and the budget.
		"[rank 0] flood refusal: rank 0 of generation 0 (pid ",
		"KVGet refused: this worker has 64 calls waiting at the coordinator through its agent, its budget",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("stdout lacks %q\nstdout:\n%s\nstderr:\n%s", want, out, stderr.String())
		}
	}
}
