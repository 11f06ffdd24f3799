package integration

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// runLogDir is the one run's log directory under a --log-dir:
// LOGDIR/RUN_ID/attempt-N.
func runLogDir(t *testing.T, root string) string {
	t.Helper()
	m, _ := filepath.Glob(filepath.Join(root, "*", "attempt-*"))
	if len(m) != 1 {
		t.Fatalf("run log dirs under %s: %v, want one", root, m)
	}
	return m[0]
}

// A second run appended to the first run's rankN.log, and
// a later success left an earlier failure's root-cause.json in place. Each
// run now has its own directory, which gotrain names on stderr, and a
// planted link in the log dir is never followed.
func TestLogDirPerRun(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	victim := filepath.Join(t.TempDir(), "victim")
	if err := os.WriteFile(victim, []byte("precious\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// Planted where a run id used again would put its logs.
	if err := os.Symlink(t.TempDir(), filepath.Join(root, "planted")); err != nil {
		t.Fatal(err)
	}
	if r := launch(t, time.Minute, "launch", "--nproc-per-node", "1", "--backend", "cpu", "--run-id", "planted", "--log-dir", root, "--", bin.testprog, "env"); r.code == 0 {
		t.Errorf("a run id whose log dir is a planted link ran:\n%s", r.stderr)
	}
	var dirs []string
	for _, args := range [][]string{{"exit", "--rank", "0", "--code", "5"}, {"env"}} {
		r := launch(t, time.Minute, append([]string{"launch", "--nproc-per-node", "1", "--backend", "cpu", "--run-id", "again", "--log-dir", root, "--", bin.testprog}, args...)...)
		i := strings.Index(r.stderr, "gotrain: logs in ")
		if i < 0 {
			t.Fatalf("gotrain did not say where the logs are:\n%s", r.stderr)
		}
		dirs = append(dirs, strings.TrimSpace(strings.SplitN(r.stderr[i+len("gotrain: logs in "):], "\n", 2)[0]))
	}
	if want := []string{filepath.Join(root, "again", "attempt-1"), filepath.Join(root, "again", "attempt-2")}; fmt.Sprint(dirs) != fmt.Sprint(want) {
		t.Fatalf("log dirs %v, want %v", dirs, want)
	}
	b, err := os.ReadFile(filepath.Join(dirs[1], "root-cause.json"))
	if err != nil || !strings.Contains(string(b), `"succeeded": true`) {
		t.Errorf("the successful run's root-cause.json: %s, %v", b, err)
	}
	b, _ = os.ReadFile(filepath.Join(dirs[1], "rank0.log"))
	if strings.Contains(string(b), "exiting with 5") {
		t.Errorf("the second run's rank0.log holds the first run's output:\n%s", b)
	}
	if b, _ := os.ReadFile(victim); string(b) != "precious\n" {
		t.Errorf("a file outside the log dir was written: %q", b)
	}
}
