package integration

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// oomScript fails as a PyTorch program that runs out of GPU memory does:
// torch's traceback and OutOfMemoryError line, exit status 1, at the same
// place every time.
const oomScript = `import sys

def step():
    print("Traceback (most recent call last):", file=sys.stderr)
    print('  File "%s", line 12, in <module>' % __file__, file=sys.stderr)
    print("    step()", file=sys.stderr)
    print('  File "%s", line 4, in step' % __file__, file=sys.stderr)
    print("    y = model(x)", file=sys.stderr)
    print("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 GiB. GPU 0 has a total capacity of 79.10 GiB of which 18.50 GiB is free.", file=sys.stderr)
    sys.exit(1)

step()
`

// A CUDA out-of-memory is named as such, with the GPU's memory (here: no
// driver) and the fixes; the same one at the same point in the next
// attempt ends the job, however many restarts are left.
func TestCUDAOOMNamedAndNotRetriedTwice(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	script := filepath.Join(dir, "train.py")
	if err := os.WriteFile(script, []byte(oomScript), 0o644); err != nil {
		t.Fatal(err)
	}
	logDir := filepath.Join(dir, "logs")
	r := launch(t, 2*time.Minute, "launch", "--nproc-per-node", "2", "--backend", "cpu", "--max-restarts", "5", "--restart-backoff", "100ms",
		"--standby=off", "--log-dir", logDir, "--", script)
	if r.code != 1 {
		t.Fatalf("exit %d, want 1\nstderr:\n%s", r.code, r.stderr)
	}
	for _, want := range []string{
		`(?m)^gotrain: rank \d on \S+ ran out of GPU memory \(torch\.OutOfMemoryError: CUDA out of memory\. Tried to allocate 20\.00 GiB\..*\): restarting all 2 ranks, attempt 2 of 6`,
		`(?m)^gotrain: job failed: rank \d on \S+ \(pid \d+\) ran out of GPU memory \(exit status 1\)$`,
		`not restarting: rank \d ran out of GPU memory in generation 0 and rank \d in generation 1, both at \S+train\.py:12 in <module> > \S+train\.py:4 in step \(a batch that does not fit\), so a restart can only fail the same way`,
		// No driver here; on a machine with one, the GPU's memory.
		`evidence: GPU memory at the time: unknown: (no driver on this machine|the rank was given no GPU of its own)|evidence: GPU \d+ just after the exit: `,
		`(?m)^  to fit: a smaller batch per GPU, mixed precision .*--standby off frees it$`,
	} {
		if !regexp.MustCompile(want).MatchString(r.stderr) {
			t.Errorf("stderr lacks a line matching %s:\n%s", want, r.stderr)
		}
	}
	if strings.Contains(r.stderr, "attempt 3") {
		t.Errorf("a third attempt:\n%s", r.stderr)
	}
	b, err := os.ReadFile(filepath.Join(runLogDir(t, logDir), "root-cause.json"))
	if err != nil {
		t.Fatal(err)
	}
	var rc struct {
		Failure struct {
			Cause, Fixes string
		}
	}
	if err := json.Unmarshal(b, &rc); err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`^rank \d on \S+ ran out of GPU memory$`).MatchString(rc.Failure.Cause) || !strings.Contains(rc.Failure.Fixes, "--standby off") {
		t.Errorf("root-cause.json: %s", b)
	}

	// --retry-permanent retries it anyway, until the restarts are spent.
	r = launch(t, 2*time.Minute, "launch", "--nproc-per-node", "1", "--backend", "cpu", "--max-restarts", "2", "--restart-backoff", "100ms",
		"--standby=off", "--retry-permanent", "--", script)
	if r.code != 1 || !strings.Contains(r.stderr, "attempt 3 of 3") || !strings.Contains(r.stderr, "all restarts are spent") {
		t.Errorf("--retry-permanent: exit %d\nstderr:\n%s", r.code, r.stderr)
	}
}

// oomTorchScript takes optimizer steps, then at step 5 raises torch's own
// OutOfMemoryError, from another function in each attempt: the step, which
// gotrain's hook counts, is what makes the two the same.
const oomTorchScript = `import os, time
import torch

model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x = torch.randn(8, 4)

def allocate_in_even_attempts():
    raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB (GPU 0; 79.10 GiB total capacity)")

def allocate_in_odd_attempts():
    raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB (GPU 0; 79.10 GiB total capacity)")

for step in range(1, 1000):
    if step == 6:
        if int(os.environ["TORCHELASTIC_RESTART_COUNT"]) % 2:
            allocate_in_odd_attempts()
        allocate_in_even_attempts()
    opt.zero_grad()
    model(x).sum().backward()
    opt.step()
    time.sleep(0.3)
`

// The same out-of-memory at the same optimizer step (gotrain's hook counts
// them) ends the job the second time, though each attempt made progress and
// raised it from another place.
func TestCUDAOOMAtTheSameStepAfterProgress(t *testing.T) {
	t.Parallel()
	path := needTorch(t)
	script := filepath.Join(t.TempDir(), "train.py")
	if err := os.WriteFile(script, []byte(oomTorchScript), 0o644); err != nil {
		t.Fatal(err)
	}
	r := startLaunchEnv(t, []string{"XDG_RUNTIME_DIR=" + t.TempDir(), path}, "launch", "--nproc-per-node", "1", "--backend", "cpu",
		"--max-restarts", "5", "--restart-backoff", "100ms", "--standby=off", "--", script)
	first := r.waitFor(t, regexp.MustCompile(`^gotrain: rank 0 on \S+ ran out of GPU memory \(torch\.cuda\.OutOfMemoryError: CUDA out of memory\..*\): restarting the job's one rank, attempt 2 of 6`), 4*time.Minute)
	l := r.waitFor(t, regexp.MustCompile(`not restarting: |attempt 3 of 6`), 4*time.Minute)
	want := regexp.MustCompile(`not restarting: rank 0 ran out of GPU memory in generation 0 and rank 0 in generation 1, both at step 5 \(a batch that does not fit\), so a restart can only fail the same way`)
	if !want.MatchString(l.text) {
		t.Errorf("after %q, the job does not end saying it ran out of memory at step 5 twice: %s", first.text, l.text)
	}
	<-r.done
	if code := r.cmd.ProcessState.ExitCode(); code != 1 {
		t.Errorf("exit %d, want 1", code)
	}
}
