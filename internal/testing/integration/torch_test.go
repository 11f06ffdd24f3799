package integration

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gotrain/gotrain/internal/testing/testkit"
)

// PyTorch programs, unchanged, under gotrain launch and gotrain torchrun:
// Debian's python3-torch (CPU, gloo) is enough. Without torch the tests skip
// and say why, except under CI=true, where they fail (.ci/run installs it).

var torchPy struct {
	once sync.Once
	dir  string // the directory of a python3 that imports torch
	why  string // why there is none
}

// needTorch returns the PATH under which python3 imports torch: the first
// of PATH's python3 and /usr/bin/python3 (Debian's, where python3-torch
// goes; a pyenv or venv python3 may come first in PATH) that does.
func needTorch(t *testing.T) string {
	t.Helper()
	torchPy.once.Do(func() {
		var tried []string
		cands := []string{"/usr/bin/python3"}
		if p, err := exec.LookPath("python3"); err == nil {
			cands = append([]string{p}, cands...)
		}
		for _, py := range cands {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			out, err := exec.CommandContext(ctx, py, "-c", "import torch, torch.distributed as d; assert d.is_gloo_available()").CombinedOutput()
			cancel()
			if err == nil {
				torchPy.dir = filepath.Dir(py)
				return
			}
			lines := strings.Split(strings.TrimSpace(string(out)), "\n")
			tried = append(tried, py+": "+lines[len(lines)-1])
		}
		torchPy.why = "no python3 imports torch with gloo (" + strings.Join(tried, "; ") + "); install it with: apt-get install --no-install-recommends python3-torch"
	})
	if torchPy.dir == "" {
		if os.Getenv("CI") == "true" {
			t.Fatal(torchPy.why)
		}
		t.Skip(torchPy.why)
	}
	return "PATH=" + torchPy.dir + string(os.PathListSeparator) + os.Getenv("PATH")
}

// runTorch runs gotrain with args under the PATH of a python3 with torch.
func runTorch(t *testing.T, timeout time.Duration, args ...string) result {
	t.Helper()
	path := needTorch(t)
	ctx, cancel := context.WithTimeout(t.Context(), timeout)
	defer cancel()
	start := time.Now()
	cmd := gotrainCmd(ctx, t, []string{path}, args...)
	cmd.Dir = t.TempDir()
	var out, errb testkit.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	r := result{stdout: out.String(), stderr: errb.String()}
	if ee, ok := err.(*exec.ExitError); ok {
		r.code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("gotrain %v: %v", args, err)
	}
	if ctx.Err() != nil {
		t.Fatalf("gotrain %v did not finish within %s\nstdout:\n%s\nstderr:\n%s", args, timeout, r.stdout, r.stderr)
	}
	t.Logf("gotrain %s: %.1fs", strings.Join(args, " "), time.Since(start).Seconds())
	return r
}

func testdata(t *testing.T, name string) string {
	p, err := filepath.Abs(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// checkDDP checks a run of testdata/ddp_train.py with two ranks: it
// trained, the ranks agree, and every rank saw torchrun's variables.
func checkDDP(t *testing.T, r result) {
	t.Helper()
	if r.code != 0 || !strings.Contains(r.stdout, "[rank 0] world_size=2 ") || !strings.Contains(r.stdout, "ranks_agree=true") {
		t.Fatalf("exit %d, want 0 and ranks_agree=true from 2 ranks\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
	}
	for _, rank := range []string{"0", "1"} {
		var env string
		for _, l := range strings.Split(r.stdout, "\n") {
			if strings.HasPrefix(l, "[rank "+rank+"] env ") {
				env = l
			}
		}
		for _, want := range []string{"LOCAL_RANK=" + rank, "LOCAL_WORLD_SIZE=2", "GROUP_RANK=0", "GROUP_WORLD_SIZE=1",
			"ROLE_NAME=default", "ROLE_RANK=" + rank, "ROLE_WORLD_SIZE=2", "TORCHELASTIC_RESTART_COUNT=0",
			"TORCHELASTIC_RUN_ID=gotrain-", "TORCHELASTIC_ERROR_FILE=/", "OMP_NUM_THREADS=1"} {
			if !strings.Contains(env, " "+want) {
				t.Errorf("rank %s's environment lacks %s: %q", rank, want, env)
			}
		}
	}
	if n := strings.Count(r.stderr, "Setting OMP_NUM_THREADS environment variable for each process to be 1"); n != 1 {
		t.Errorf("torchrun's OMP_NUM_THREADS warning %d times, want once\nstderr:\n%s", n, r.stderr)
	}
}

// A gloo DDP training loop, unchanged, under gotrain launch: the .py runs
// with python3 (said once).
func TestTorchDDPLaunch(t *testing.T) {
	t.Parallel()
	script := testdata(t, "ddp_train.py")
	r := runTorch(t, 3*time.Minute, "launch", "--nproc-per-node", "2", "--backend", "cpu", "--", script)
	checkDDP(t, r)
	if n := strings.Count(r.stderr, "gotrain: running "+script+" with "); n != 1 {
		t.Errorf("%d lines saying the script runs with python3, want 1\nstderr:\n%s", n, r.stderr)
	}
}

// The same under torchrun's own command line.
func TestTorchDDPTorchrun(t *testing.T) {
	t.Parallel()
	r := runTorch(t, 3*time.Minute, "torchrun", "--nproc_per_node=2", "--standalone", testdata(t, "ddp_train.py"))
	checkDDP(t, r)
	if strings.Contains(r.stderr, "note:") {
		t.Errorf("notes for flags that take effect:\n%s", r.stderr)
	}
}

// An elastic script that checkpoints every step: rank 1 is SIGKILLed after
// step 4, the job restarts (torchrun's --max-restarts 1), every rank resumes
// from the checkpoint with TORCHELASTIC_RESTART_COUNT=1 and finishes.
func TestTorchElasticResumesAfterKilledRank(t *testing.T) {
	t.Parallel()
	ckpt := filepath.Join(t.TempDir(), "ckpt.pt")
	r := runTorch(t, 3*time.Minute, "torchrun", "--nproc-per-node", "2", "--standalone", "--max_restarts=1", "--monitor-interval", "1",
		testdata(t, "elastic_ckpt.py"), ckpt, "10", "4")
	if r.code != 0 {
		t.Fatalf("exit %d, want 0\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
	}
	for _, want := range []string{"[rank 1] rank 1 kills itself after step 4", "[rank 0] resumed from step 4 at restart 1",
		"[rank 1] resumed from step 4 at restart 1", "[rank 0] done steps=10 restart=1 ranks_agree=true"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("stdout lacks %q\nstdout:\n%s\nstderr:\n%s", want, r.stdout, r.stderr)
		}
	}
	for _, want := range []string{"note: --monitor-interval 1 has no effect", "rank 1", "SIGKILL"} {
		if !strings.Contains(r.stderr, want) {
			t.Errorf("stderr lacks %q\nstderr:\n%s", want, r.stderr)
		}
	}
}

// TestTorchRecordErrorFileInRootCause: the exception that @record writes to
// TORCHELASTIC_ERROR_FILE is in the failure report.
func TestTorchRecordErrorFileInRootCause(t *testing.T) {
	t.Parallel()
	needTorch(t)
	r := runTorch(t, 3*time.Minute, "launch", "--nproc-per-node", "1", "--backend", "cpu", "--max-restarts", "0", "--", testdata(t, "record_fail.py"))
	if r.code == 0 || !strings.Contains(r.stderr, "@record): RuntimeError: loss is NaN at step 7") {
		t.Errorf("exit %d; want the error file's exception in the report:\n%s", r.code, r.stderr)
	}
}
