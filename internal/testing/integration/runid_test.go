package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gotrain/gotrain/internal/testing/testkit"
)

// runTool runs `gotrain ARGS` in env and returns its exit status, stdout
// and stderr.
func runTool(t *testing.T, env []string, args ...string) (int, string, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin.gotrain, args...)
	cmd.Env = env
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return 0, out.String(), errb.String()
	case errors.As(err, &ee) && ctx.Err() == nil:
		return ee.ExitCode(), out.String(), errb.String()
	}
	t.Fatalf("gotrain %v: %v\n%s", args, err, errb.String())
	return 0, "", ""
}

// With two jobs on the machine, `gotrain top` and `gotrain diagnose` show
// the one --run-id names; without it the newest, saying so and naming the
// other; an unknown run id is a usage error that lists the running ones.
func TestTopAndDiagnosePickTheRunID(t *testing.T) {
	t.Parallel()
	runtimeDir := t.TempDir()
	runFiles := func(n int) {
		testkit.WaitFor(t, 60*time.Second, "the run files", func() bool {
			files, _ := filepath.Glob(filepath.Join(runtimeDir, "gotrain", "*.json"))
			return len(files) >= n
		})
	}
	start := func(id string) *running {
		return startLaunch(t, runtimeDir, "launch", "--run-id", id, "--nproc-per-node", "1", "--backend", "cpu", "--max-restarts", "0",
			"--standby=off", "--grace-period", "1s", "--", bin.testprog, "hang", "--fault", "none", "--steps", "100000", "--step-time", "50ms")
	}
	a := start("job-a")
	runFiles(1)
	start("job-b") // newer
	runFiles(2)
	env := a.env // the same XDG_RUNTIME_DIR as both jobs

	topRunID := func(args ...string) (string, string) {
		code, out, stderr := runTool(t, env, append([]string{"top", "--once", "--json"}, args...)...)
		var snap topJSON
		if code != 0 || json.Unmarshal([]byte(out), &snap) != nil {
			t.Fatalf("gotrain top %v: exit %d\n%s\n%s", args, code, out, stderr)
		}
		return snap.RunID, stderr
	}
	for _, id := range []string{"job-a", "job-b"} {
		if got, stderr := topRunID("--run-id", id); got != id || stderr != "" {
			t.Errorf("top --run-id %s shows %s; stderr %q", id, got, stderr)
		}
	}
	got, stderr := topRunID()
	if got != "job-b" || !strings.Contains(stderr, "gotrain top: 2 jobs run on this machine; showing the newest, job-b (started ") ||
		!strings.Contains(stderr, "pass --run-id to pick another: job-a") {
		t.Errorf("top without --run-id shows %s; stderr %q", got, stderr)
	}

	code, out, stderr := runTool(t, env, "diagnose", "--json", "--run-id", "job-a")
	var d struct {
		Status struct {
			RunID string `json:"run_id"`
		} `json:"status"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &d) != nil || d.Status.RunID != "job-a" {
		t.Errorf("diagnose --run-id job-a: exit %d, run %q\n%s\n%s", code, d.Status.RunID, out, stderr)
	}

	code, _, stderr = runTool(t, env, "diagnose", "--run-id", "job-c")
	if code != 2 || !strings.Contains(stderr, "job-c (running: job-b, job-a)") || !strings.Contains(stderr, "Pass one of the running jobs' run ids") {
		t.Errorf("diagnose --run-id job-c: exit %d\n%s", code, stderr)
	}
	code, _, stderr = runTool(t, env, "top", "--once", "--run-id", "job-a", "--coordinator", "127.0.0.1:1")
	if code != 2 || !strings.Contains(stderr, "--run-id and --coordinator together") {
		t.Errorf("top --run-id --coordinator: exit %d\n%s", code, stderr)
	}
}
