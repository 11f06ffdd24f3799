package integration

import (
	"regexp"
	"strings"
	"testing"
	"time"
)

var (
	weightsLine = regexp.MustCompile(`(?m)^\[rank 0\] weights fnv64a=([0-9a-f]{16})$`)
	resumedLine = regexp.MustCompile(`(?m)^\[rank 0\] resumed at epoch \d+ step \d+ of \d+ \(global step (\d+)\) from (.*)$`)
)

// A rank SIGKILLed after step k's snapshot is in its agent's
// memory; the job restarts (every rank is a new process) and resumes at
// step k out of the agents' memory (no --checkpoint-dir: there is no disk
// tier to fall back on), with weights bit-identical to a run without the
// fault.
func TestKilledRankResumesFromAgentMemory(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("trains MNIST twice")
	}
	args := []string{"launch", "--nproc-per-node", "2", "--backend", "cpu", "--max-restarts", "1", "--grace-period", "3s",
		"--", bin.mnist, "--epochs", "1", "--limit", "6400", "--snapshots", "--print-weight-hash"}
	clean := launch(t, 5*time.Minute, args...)
	if clean.code != 0 {
		t.Fatalf("the run without a fault: exit %d\nstdout:\n%s\nstderr:\n%s", clean.code, clean.stdout, clean.stderr)
	}
	want := weightsLine.FindStringSubmatch(clean.stdout)
	if want == nil || resumedLine.MatchString(clean.stdout) {
		t.Fatalf("the run without a fault: no weights line, or it resumed:\n%s", clean.stdout)
	}

	faulty := launch(t, 5*time.Minute, append(args, "--die-at-step", "50", "--die-rank", "1")...)
	if faulty.code != 0 {
		t.Fatalf("the run with a fault: exit %d\nstdout:\n%s\nstderr:\n%s", faulty.code, faulty.stdout, faulty.stderr)
	}
	if !strings.Contains(faulty.stdout, "[rank 1] dying at step 50: SIGKILL") || len(killedRestart.FindAllString(faulty.stderr, -1)) != 1 {
		t.Fatalf("rank 1 was not SIGKILLed at step 50 once:\nstdout:\n%s\nstderr:\n%s", faulty.stdout, faulty.stderr)
	}
	m := resumedLine.FindStringSubmatch(faulty.stdout)
	if m == nil || m[1] != "50" || !strings.HasPrefix(m[2], "the agent's memory") {
		t.Fatalf("want the restarted job to resume at global step 50 from the agent's memory, got %q:\n%s", m, faulty.stdout)
	}
	got := weightsLine.FindStringSubmatch(faulty.stdout)
	if got == nil || got[1] != want[1] {
		t.Errorf("final weights %v after the fault, want %s as without it:\n%s", got, want[1], faulty.stdout)
	}
	if m := finalLine.FindStringSubmatch(faulty.stdout); m == nil || m[2] != "true" {
		t.Errorf("the ranks do not agree:\n%s", faulty.stdout)
	}
}

// Real PyTorch (gloo) with the gotrain package (restore_into) the agent
// puts on the workers' PYTHONPATH; rank 1 SIGKILLed after step 20 resumes
// at step 20 from its agent's memory, with weights bit-identical to a run
// without the fault.
func TestTorchRankResumesFromAgentMemory(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("runs PyTorch twice")
	}
	script := testdata(t, "memsnap_torch.py")
	weights := regexp.MustCompile(`(?m)^\[rank 0\] weights (\S+)$`)
	clean := runTorch(t, 5*time.Minute, "launch", "--nproc-per-node", "2", "--backend", "cpu", "--", "python3", script)
	want := weights.FindStringSubmatch(clean.stdout)
	if clean.code != 0 || want == nil || strings.Contains(clean.stdout, "resumed") {
		t.Fatalf("the run without a fault: exit %d\nstdout:\n%s\nstderr:\n%s", clean.code, clean.stdout, clean.stderr)
	}
	faulty := runTorch(t, 5*time.Minute, "launch", "--nproc-per-node", "2", "--backend", "cpu", "--max-restarts", "1", "--", "python3", script, "--die")
	if faulty.code != 0 || !strings.Contains(faulty.stdout, "[rank 1] dying at step 20") {
		t.Fatalf("the run with a fault: exit %d\nstdout:\n%s\nstderr:\n%s", faulty.code, faulty.stdout, faulty.stderr)
	}
	for _, rank := range []string{"0", "1"} {
		if !strings.Contains(faulty.stdout, "[rank "+rank+"] resumed at step 20 from the agent's memory") {
			t.Errorf("rank %s did not resume at step 20 from the agent's memory:\n%s", rank, faulty.stdout)
		}
	}
	if got := weights.FindStringSubmatch(faulty.stdout); got == nil || got[1] != want[1] {
		t.Errorf("weights %v after the fault, want %s as without it:\n%s", got, want[1], faulty.stdout)
	}
}
