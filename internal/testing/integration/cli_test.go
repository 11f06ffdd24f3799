package integration

// The command line as a new user meets it: diagnose's exit status
// on a hang, the CPU benchmark's defaults, the MNIST demo's steps in
// gotrain top, restarts that back off, and a spawn out of file descriptors.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gotrain/gotrain/internal/testing/testkit"
)

// gotrainRun runs gotrain ARGS in env (r's, for a command about r's job)
// and returns its stdout, stderr and exit status.
func gotrainRun(t *testing.T, env []string, timeout time.Duration, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin.gotrain, args...)
	cmd.Env = env
	var o, e strings.Builder
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee) && ctx.Err() == nil:
		code = ee.ExitCode()
	case err != nil:
		t.Fatalf("gotrain %s: %v\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), err, o.String(), e.String())
	}
	return o.String(), e.String(), code
}

// gotrain diagnose exits 3 when it reports a hang, and its text quotes the
// collective the verdict is about.
func TestDiagnoseExitsThreeOnHang(t *testing.T) {
	t.Parallel()
	r := startLaunch(t, t.TempDir(), "launch", "--nproc-per-node", "3", "--backend", "cpu", "--max-restarts", "0",
		"--hang-timeout", hangTimeout.String(), "--grace-period", "1s", "--",
		bin.testprog, "hang", "--fault", "skip", "--fault-rank", strconv.Itoa(faultRank),
		"--fault-step", strconv.Itoa(faultStep), "--step-time", "300ms")
	r.waitFor(t, faultLine, 60*time.Second)
	// (Exit 0 without a verdict is checked by hang_test.go's diagnose:
	// exit 3 exactly when the answer has a verdict.)
	r.waitFor(t, regexp.MustCompile(`^gotrain: hang detected`), verdictLimit+5*time.Second)
	stdout, stderr, code := gotrainRun(t, r.env, 30*time.Second, "diagnose")
	if code != 3 {
		t.Errorf("gotrain diagnose with a hang verdict: exit %d, want 3\nstderr: %s", code, stderr)
	}
	want := regexp.MustCompile(fmt.Sprintf(`(?m)^  collective: allreduce #%d .*of comm "hang", stalled \S+, ranks 0,2 waiting in it$`, faultStep))
	if !strings.Contains(stdout, "VERDICT [never-entered]") || !want.MatchString(stdout) {
		t.Errorf("gotrain diagnose:\n%s\nwant the verdict and a line matching %s", stdout, want)
	}
}

// gotrain bench --backend cpu with its defaults finishes (it took minutes
// and 8 GB a rank with the GPU defaults) and measures up to 32 MiB.
func TestBenchCPUDefaultsFinish(t *testing.T) {
	t.Parallel()
	start := time.Now()
	// The bound is generous: the defaults take a few seconds on an idle
	// machine; the point is that they finish.
	r := launch(t, 2*time.Minute, "bench", "allreduce", "--backend", "cpu")
	t.Logf("gotrain bench allreduce --backend cpu: %s", time.Since(start).Round(time.Millisecond))
	if r.code != 0 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
	}
	largest := regexp.MustCompile(`(?m)^\s+33554432\s+8388608\s+float32\s+sum\s.*\s0$`)
	if !largest.MatchString(r.stdout) || strings.Contains(r.stdout, "134217728") {
		t.Errorf("the table does not end at 32 MiB with no wrong elements:\n%s", r.stdout)
	}
	if !strings.Contains(r.stdout, "2 warm-up + 10 timed iterations") {
		t.Errorf("the header does not show the CPU defaults (2 warm-up, 10 timed):\n%s", r.stdout)
	}
}

// The MNIST demo reports its step through package worker: gotrain top shows
// its ranks' STEP and STEP/S.
func TestMNISTStepsInTop(t *testing.T) {
	t.Parallel()
	const ranks = 2
	r := startLaunch(t, t.TempDir(), "launch", "--nproc-per-node", strconv.Itoa(ranks), "--backend", "cpu", "--max-restarts", "0",
		"--grace-period", "1s", "--", bin.mnist, "--epochs", "50")
	// Rank 0's first line: the job (and its run file) is up.
	r.waitFor(t, regexp.MustCompile(`mnist: \d+ ranks`), 90*time.Second)
	var snap topJSON
	var out string
	testkit.WaitFor(t, 120*time.Second, "the MNIST ranks' steps and step rates in gotrain top", func() bool {
		out = gotrainTop(t, r, "--once", "--json")
		snap = topJSON{}
		if err := json.Unmarshal([]byte(out), &snap); err != nil {
			t.Fatalf("gotrain top --once --json does not parse: %v\n%s", err, out)
		}
		if len(snap.Ranks) != ranks {
			return false
		}
		for _, rk := range snap.Ranks {
			if rk.Step < 2 || !(rk.StepsPerSecond > 0) {
				return false
			}
		}
		return true
	})
	if t.Failed() {
		t.Logf("gotrain top's last output:\n%s", out)
	}
}

// A program that fails at once, every time, is restarted with a growing
// pause, and the report says how many times it failed the same way.
func TestRestartsOfRepeatedFailureBackOff(t *testing.T) {
	t.Parallel()
	start := time.Now()
	r := launch(t, time.Minute, "launch", "--nproc-per-node", "1", "--backend", "cpu", "--max-restarts", "2", "--",
		"sh", "-c", "exit 1")
	took := time.Since(start)
	if r.code != 1 {
		t.Fatalf("exit %d, want 1\nstderr:\n%s", r.code, r.stderr)
	}
	if !strings.Contains(r.stderr, "the same failure 3 times, each before any rank made progress") {
		t.Errorf("the report does not say the same failure 3 times:\n%s", r.stderr)
	}
	// No pause after the first failure, 1 s after the second.
	if took < time.Second {
		t.Errorf("three generations that fail at once took %s; want at least the 1s pause after the second failure", took)
	}
}

// A spawn that fails for lack of file descriptors says to raise ulimit -n,
// in the root cause at the end.
func TestSpawnOutOfFilesSaysUlimit(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "sh", "-c", `ulimit -n 64 && exec "$0" "$@"`, bin.gotrain,
		"launch", "--nproc-per-node", "40", "--backend", "cpu", "--max-restarts", "0", "--grace-period", "1s", "--", "sleep", "10")
	cmd.Env = gotrainCmd(ctx, t, nil).Env
	var stderr strings.Builder
	cmd.Stderr = &stderr
	err := cmd.Run()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ctx.Err() != nil {
		t.Fatalf("gotrain launch of 40 ranks under ulimit -n 64: %v (want a failure)\n%s", err, stderr.String())
	}
	report := stderr.String()
	if i := strings.LastIndex(report, "gotrain: job failed:"); i >= 0 {
		report = report[i:]
	}
	if !strings.Contains(report, "too many open files (raise the open-files limit: ulimit -n)") {
		t.Errorf("the final report does not say to raise ulimit -n:\n%s", stderr.String())
	}
}
