// Package integration runs the real gotrain binary and real worker processes
// end to end on the CPU backend: collectives through `gotrain launch`, exit
// codes, signals and orphan checks, the MNIST example.
//
// The binaries are built once, in TestMain, and the tests run in parallel:
// each job's processes carry the test's tag in their environment (gotrainCmd),
// so a test's orphan checks see its own processes only; ports are the
// kernel's (127.0.0.1:0) and files go to the test's own temporary directory.
package integration

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gotrain/gotrain/internal/testing/testbin"
)

var bin struct{ gotrain, testprog, mnist, recover string }

func TestMain(m *testing.M) {
	pkgs := []string{"./cmd/gotrain", "./internal/testing/integration/testprog", "./examples/mnist", "./examples/recover"}
	testbin.Main(m, "gotrain-integration-", pkgs, func(_ string, built map[string]string) error {
		bin.gotrain, bin.testprog, bin.mnist, bin.recover = built[pkgs[0]], built[pkgs[1]], built[pkgs[2]], built[pkgs[3]]
		return nil
	})
}

// testTagEnv names the environment variable that tags every process a test
// starts (and, inherited, every process its jobs start) with the test.
const testTagEnv = "INTEGRATION_TEST_TAG"

// testTag is t's tag, NAME=VALUE: unique to the test and to this test
// process, so that two runs of the package at once do not mix either.
func testTag(t testing.TB) string {
	return fmt.Sprintf("%s=%d/%s", testTagEnv, os.Getpid(), t.Name())
}

// gotrainCmd is the gotrain binary with args, in t's environment: this
// process's, tagged with t (see leftovers), plus env.
func gotrainCmd(ctx context.Context, t testing.TB, env []string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, bin.gotrain, args...)
	cmd.Env = append(append(os.Environ(), testTag(t)), env...)
	return cmd
}

// result is a finished `gotrain launch`.
type result struct {
	code           int
	stdout, stderr string
}

// launch runs gotrain with args and waits for it.
func launch(t *testing.T, timeout time.Duration, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), timeout)
	defer cancel()
	cmd := gotrainCmd(ctx, t, nil, args...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	r := result{stdout: out.String(), stderr: errb.String()}
	var ee *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &ee):
		r.code = ee.ExitCode()
	default:
		t.Fatalf("gotrain %v: %v", args, err)
	}
	if ctx.Err() != nil {
		t.Fatalf("gotrain %v did not finish within %s\nstdout:\n%s\nstderr:\n%s", args, timeout, r.stdout, r.stderr)
	}
	return r
}

// TestCollectivesExact runs every collective, dtype and op through `gotrain
// launch` for each world size, at sizes up to 65537 elements (larger than
// one chunk, not a multiple of any world size). The arithmetic at every size
// up to 1 M elements is worker/cpucomm's tests' job, in process; here the
// point is the real processes, their rendezvous and the wire between them.
func TestCollectivesExact(t *testing.T) {
	t.Parallel()
	const maxCount = "65537"
	for _, n := range []int{1, 2, 3, 4, 7} {
		t.Run(fmt.Sprintf("ranks=%d", n), func(t *testing.T) {
			t.Parallel()
			r := launch(t, 5*time.Minute, "launch", "--nproc-per-node", strconv.Itoa(n), "--backend", "cpu", "--",
				bin.testprog, "collectives", "--max", maxCount)
			if r.code != 0 {
				t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
			}
			for rank := range n {
				if !strings.Contains(r.stdout, fmt.Sprintf("[rank %d] collectives ok:", rank)) {
					t.Errorf("rank %d did not report success\nstdout:\n%s\nstderr:\n%s", rank, r.stdout, r.stderr)
				}
			}
		})
	}
}

func TestExitCodeOfFailingRank(t *testing.T) {
	t.Parallel()
	r := launch(t, time.Minute, "launch", "--nproc-per-node", "3", "--backend", "cpu", "--grace-period", "2s", "--",
		bin.testprog, "exit", "--rank", "1", "--code", "3")
	if r.code != 3 {
		t.Fatalf("exit %d, want 3\nstderr:\n%s", r.code, r.stderr)
	}
	for _, want := range []string{"rank 1", "exit status 3", "exiting with 3 on purpose"} {
		if !strings.Contains(r.stderr, want) {
			t.Errorf("stderr does not mention %q:\n%s", want, r.stderr)
		}
	}
}

func TestEnvironment(t *testing.T) {
	t.Parallel()
	r := launch(t, time.Minute, "launch", "--nproc-per-node", "2", "--backend", "cpu", "--run-id", "envtest", "--", bin.testprog, "env")
	if r.code != 0 {
		t.Fatalf("exit %d\n%s", r.code, r.stderr)
	}
	for rank := range 2 {
		for _, kv := range []string{
			fmt.Sprintf("RANK=%d", rank), fmt.Sprintf("LOCAL_RANK=%d", rank), "WORLD_SIZE=2", "LOCAL_WORLD_SIZE=2",
			"GROUP_RANK=0", "MASTER_ADDR=127.0.0.1", "TORCHELASTIC_RUN_ID=envtest", "TORCHELASTIC_RESTART_COUNT=0",
			fmt.Sprintf("GOTRAIN_RANK=%d", rank), "GOTRAIN_BACKEND=cpu", "GOTRAIN_GENERATION=0", "NCCL_NVLS_ENABLE=0",
		} {
			if !strings.Contains(r.stdout, fmt.Sprintf("[rank %d] %s\n", rank, kv)) {
				t.Errorf("rank %d lacks %s\n%s", rank, kv, r.stdout)
			}
		}
		if !strings.Contains(r.stdout, fmt.Sprintf("[rank %d] MASTER_PORT=", rank)) || strings.Contains(r.stdout, "MASTER_PORT=0\n") {
			t.Errorf("rank %d has no usable MASTER_PORT\n%s", rank, r.stdout)
		}
	}
}

func TestLogDir(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	r := launch(t, time.Minute, "launch", "--nproc-per-node", "2", "--backend", "cpu", "--log-dir", dir, "--", bin.testprog, "env")
	if r.code != 0 {
		t.Fatalf("exit %d\n%s", r.code, r.stderr)
	}
	for rank := range 2 {
		b, err := os.ReadFile(filepath.Join(runLogDir(t, dir), fmt.Sprintf("rank%d.log", rank)))
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(b), fmt.Sprintf("\nGOTRAIN_RANK=%d\n", rank)) {
			t.Errorf("rank%d.log lacks the rank's output:\n%s", rank, b)
		}
	}
	// What the job made is its user's alone: directories 0700, files 0600
	// (a rank's output may hold what it printed of its data).
	attempt := runLogDir(t, dir)
	files, _ := filepath.Glob(filepath.Join(attempt, "*"))
	for _, p := range append([]string{filepath.Dir(attempt), attempt}, files...) {
		st, err := os.Lstat(p)
		if err != nil {
			t.Fatal(err)
		}
		want := os.FileMode(0o600)
		if st.IsDir() {
			want = 0o700
		}
		if st.Mode().Perm() != want {
			t.Errorf("%s: mode %v, want %v", p, st.Mode().Perm(), want)
		}
	}
	if len(files) < 3 {
		t.Errorf("the attempt's log dir holds %v, want the two rank logs and root-cause.json", files)
	}
}

func TestBadInvocations(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		args []string
		code int
		want string
	}{
		{"no program", []string{"launch", "--nproc-per-node", "2", "--backend", "cpu"}, 2, "Put the program after `--`"},
		{"missing program", []string{"launch", "--nproc-per-node", "2", "--backend", "cpu", "--", "./no-such-program"}, 2, "no-such-program"},     // the caller's mistake, found before anything starts: a usage error, exit 2
		{"bad backend", []string{"launch", "--nproc-per-node", "2", "--backend", "gloo", "--", "true"}, 2, "Use --backend cpu or --backend nccl"}, // a usage error: exit 2, not a job's failure
		{"bad flag", []string{"launch", "--no-such-flag"}, 2, "no-such-flag"},
		{"unknown command", []string{"lunch"}, 2, "unknown command"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := launch(t, 30*time.Second, tc.args...)
			if r.code != tc.code || !strings.Contains(r.stderr, tc.want) {
				t.Errorf("exit %d (want %d), stderr:\n%s\nwant it to contain %q", r.code, tc.code, r.stderr, tc.want)
			}
		})
	}
}

func TestNoGPUsNeedsExplicitCount(t *testing.T) {
	t.Parallel()
	if matches, _ := filepath.Glob("/dev/nvidia[0-9]*"); len(matches) > 0 {
		t.Skip("this machine has GPUs")
	}
	r := launch(t, 30*time.Second, "launch", "--", "true")
	if r.code != 2 || !strings.Contains(r.stderr, "--backend cpu --nproc-per-node N") {
		t.Errorf("exit %d, stderr:\n%s", r.code, r.stderr)
	}
}

func TestLaunchHelpDocumentsEveryFlag(t *testing.T) {
	t.Parallel()
	r := launch(t, 30*time.Second, "launch", "--help-all")
	if r.code != 0 {
		t.Fatalf("exit %d", r.code)
	}
	for _, flag := range []string{"-nproc-per-node", "-gpus", "-backend", "-log-dir", "-nnodes", "-coordinator", "-max-restarts", "-grace-period", "-job-token"} {
		if !strings.Contains(r.stderr+r.stdout, flag) {
			t.Errorf("--help-all does not document %s", flag)
		}
	}
}

// A worker that closes its output and runs on has not exited: the agent
// waits for its real exit status instead of taking the pipes' EOF for it
// (internal/launcher/exitearly.go checks /proc).
func TestClosedOutputIsNoExit(t *testing.T) {
	t.Parallel()
	r := launch(t, time.Minute, "launch", "--nproc-per-node", "1", "--backend", "cpu", "--max-restarts", "0", "--",
		bin.testprog, "closeout", "--code", "4", "--after", "1s")
	if r.code != 4 {
		t.Fatalf("exit %d, want 4 (the worker's status after it closed its output)\nstderr:\n%s", r.code, r.stderr)
	}
	if !strings.Contains(r.stderr, "exit status 4") {
		t.Errorf("stderr does not name exit status 4:\n%s", r.stderr)
	}
}
