package output

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Each run writes into a directory of its own, also when a run id is
// used again.
func TestRunLogDirsAreTheirOwn(t *testing.T) {
	root := t.TempDir()
	for _, want := range []string{"attempt-1", "attempt-2"} {
		dir, err := OpenRunLogDir(root, "run/x")
		if err != nil {
			t.Fatal(err)
		}
		if dir != filepath.Join(root, "run_x", want) {
			t.Errorf("got %s, want .../run_x/%s", dir, want)
		}
	}
}

// A log dir of another user's, or one anybody can write without the
// sticky bit, is refused.
func TestLogRootChecked(t *testing.T) {
	if err := CheckLogRoot(filepath.Join(t.TempDir(), "a", "b")); err != nil {
		t.Errorf("a new log dir: %v", err)
	}
	if os.Getuid() != 0 {
		t.Skip("a directory of another user needs root (chown)")
	}
	theirs := t.TempDir()
	if err := os.Chown(theirs, 54321, 54321); err != nil {
		t.Fatal(err)
	}
	if err := CheckLogRoot(theirs); err == nil || !strings.Contains(err.Error(), "belongs to uid 54321") {
		t.Errorf("another user's log dir: %v", err)
	}
}
