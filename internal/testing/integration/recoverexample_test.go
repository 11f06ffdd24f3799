package integration

import (
	"regexp"
	"strings"
	"testing"
	"time"
)

var recoverDone = regexp.MustCompile(`(?m)^\[rank 0\] done step=(\d+) w=(\S+) b=(\S+)$`)

// launchRecover runs examples/recover on two CPU ranks and returns rank 0's
// final line (step, w, b) after checking that both ranks agreed.
func launchRecover(t *testing.T, args ...string) (string, []string) {
	t.Helper()
	r := launch(t, 3*time.Minute, append([]string{"launch", "--nproc-per-node", "2", "--backend", "cpu", "--max-restarts", "1", "--grace-period", "3s",
		"--", bin.recover}, args...)...)
	if r.code != 0 {
		t.Fatalf("recover %v: exit %d\nstdout:\n%s\nstderr:\n%s", args, r.code, r.stdout, r.stderr)
	}
	for _, rank := range []string{"0", "1"} {
		if !strings.Contains(r.stdout, "[rank "+rank+"] rank "+rank+" agrees\n") {
			t.Errorf("rank %s did not end agreeing with rank 0:\n%s", rank, r.stdout)
		}
	}
	m := recoverDone.FindStringSubmatch(r.stdout)
	if m == nil {
		t.Fatalf("no final line:\n%s", r.stdout)
	}
	return r.stdout, m[1:]
}

// TestRecoverExampleResumesExactly: the example of worker.Run ends with the
// weights of a run that never stopped, bit for bit, both when rank 1 dies
// and rank 0 survives in process (Generation.Restore from the survivor)
// and when a new job resumes from the disk checkpoint (worker.Restore).
func TestRecoverExampleResumesExactly(t *testing.T) {
	t.Parallel()
	_, want := launchRecover(t, "--steps", "60")
	if want[0] != "60" {
		t.Fatalf("the clean run ended at step %s, want 60", want[0])
	}

	t.Run("survivor", func(t *testing.T) {
		t.Parallel()
		out, got := launchRecover(t, "--steps", "60", "--die-at-step", "25", "--die-rank", "1")
		if !strings.Contains(out, "[rank 1] rank 1 dies on purpose at step 25\n") {
			t.Fatalf("rank 1 did not die at step 25:\n%s", out)
		}
		for _, rank := range []string{"0", "1"} {
			if want := "[rank " + rank + "] generation 1: restored step 25 from surviving rank 0\n"; !strings.Contains(out, want) {
				t.Errorf("stdout lacks %q:\n%s", want, out)
			}
		}
		if strings.Join(got, " ") != strings.Join(want, " ") {
			t.Errorf("after the death: step, w, b = %v; without it %v", got, want)
		}
	})

	t.Run("disk", func(t *testing.T) {
		t.Parallel()
		dir := t.TempDir()
		launchRecover(t, "--steps", "30", "--checkpoint-dir", dir, "--checkpoint-every", "10")
		out, got := launchRecover(t, "--steps", "60", "--checkpoint-dir", dir, "--checkpoint-every", "10")
		for _, rank := range []string{"0", "1"} {
			if want := "[rank " + rank + "] generation 0: restored step 30 from disk of rank 0\n"; !strings.Contains(out, want) {
				t.Errorf("stdout lacks %q:\n%s", want, out)
			}
		}
		if strings.Join(got, " ") != strings.Join(want, " ") {
			t.Errorf("resumed from disk: step, w, b = %v; uninterrupted %v", got, want)
		}
	})
}
