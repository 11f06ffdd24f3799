package integration

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// A restart is one plain line on stderr, naming the rank, its host, how it
// ended and what comes next; the coordinator's logfmt lines stay out of a
// one-node job's output, and the failure report is printed once.
func TestRestartLine(t *testing.T) {
	t.Parallel()
	r := launch(t, 2*time.Minute, "launch", "--nproc-per-node", "3", "--backend", "cpu", "--grace-period", "2s",
		"--max-restarts", "2", "--restart-backoff", "300ms", "--standby=off", "--", bin.testprog, "exit", "--rank", "2", "--code", "7")
	if r.code != 7 {
		t.Fatalf("exit %d, want 7\nstderr:\n%s", r.code, r.stderr)
	}
	// The second failure in a row before any progress waits 1 s more.
	for _, want := range []string{
		`(?m)^gotrain: rank 2 on \S+ exited 7 \(rank 2 exiting with 7 on purpose\): restarting all 3 ranks, attempt 2 of 3, in 0\.3 s$`,
		`(?m)^gotrain: rank 2 on \S+ exited 7 \(rank 2 exiting with 7 on purpose\): restarting all 3 ranks, attempt 3 of 3, in 1\.3 s$`,
	} {
		if !regexp.MustCompile(want).MatchString(r.stderr) {
			t.Errorf("stderr lacks a line matching %s:\n%s", want, r.stderr)
		}
	}
	for _, unwanted := range []string{"generation ended", "level=", "attempt 4", "Setting OMP_NUM_THREADS"} { // torchrun's banner: Python programs only
		if strings.Contains(r.stderr, unwanted) {
			t.Errorf("stderr has %q:\n%s", unwanted, r.stderr)
		}
	}
	if n := strings.Count(r.stderr, "job failed in generation 2"); n != 1 {
		t.Errorf("the failure report is printed %d times, want once:\n%s", n, r.stderr)
	}
}

// A failure that can only repeat ends the job at once, saying so, however
// many restarts are left: a Python import error, a program that cannot be
// executed. --retry-permanent restarts it anyway.
func TestPermanentFailureNotRetried(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	script := filepath.Join(dir, "train.py")
	if err := os.WriteFile(script, []byte("import gotrain_no_such_module_xyz\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	badExec := filepath.Join(dir, "train")
	if err := os.WriteFile(badExec, []byte("\x7fELF\x02\x01\x01\x00not a program"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, program string
		code          int
		want          []string
	}{
		{"import error", script, 1, []string{
			"ModuleNotFoundError: No module named 'gotrain_no_such_module_xyz'",
			"not restarting: the Python program failed with ModuleNotFoundError: No module named 'gotrain_no_such_module_xyz', so a restart can only fail the same way (--retry-permanent retries it anyway)",
		}},
		{"exec format error", badExec, 127, []string{
			"gotrain: job failed: rank 0 on ", " could not be started: ", "exec format error",
			"not restarting: the program cannot be executed: not a program for this machine (exec format error)",
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := launch(t, 2*time.Minute, "launch", "--nproc-per-node", "2", "--backend", "cpu", "--max-restarts", "3", "--standby=off", "--", tc.program)
			if r.code != tc.code {
				t.Fatalf("exit %d, want %d\nstderr:\n%s", r.code, tc.code, r.stderr)
			}
			for _, w := range tc.want {
				if !strings.Contains(r.stderr, w) {
					t.Errorf("stderr lacks %q:\n%s", w, r.stderr)
				}
			}
			if strings.Contains(r.stderr, "restarting all") || strings.Contains(r.stderr, "pid 0") {
				t.Errorf("restarted, or says pid 0:\n%s", r.stderr)
			}
			// torchrun's OMP_NUM_THREADS banner: for a Python program only, once.
			if n, want := strings.Count(r.stderr, "Setting OMP_NUM_THREADS environment variable"), map[bool]int{true: 1}[strings.HasSuffix(tc.program, ".py")]; n != want {
				t.Errorf("torchrun's OMP banner %d times, want %d:\n%s", n, want, r.stderr)
			}

			r = launch(t, 2*time.Minute, "launch", "--nproc-per-node", "2", "--backend", "cpu", "--max-restarts", "1", "--standby=off", "--retry-permanent", "--", tc.program)
			if r.code != tc.code || !strings.Contains(r.stderr, "restarting all 2 ranks, attempt 2 of 2") || !strings.Contains(r.stderr, "all restarts are spent (max restarts 1)") {
				t.Errorf("--retry-permanent: exit %d, want %d after one restart\nstderr:\n%s", r.code, tc.code, r.stderr)
			}
		})
	}
}
