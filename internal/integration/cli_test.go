package integration

// The command line as a new user meets it (issue 17): diagnose's exit status
// on a hang, the CPU benchmark's defaults, the MNIST demo's steps in
// gotrain top, restarts that back off, and a spawn out of file descriptors.

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
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
