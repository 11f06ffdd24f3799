package runfile

import (
	"errors"
	"os"
	"strings"
	"testing"
	"time"
)

func TestWriteLiveRemove(t *testing.T) {
	t.Setenv("XDG_RUNTIME_DIR", t.TempDir())
	if _, _, err := Newest(); !errors.Is(err, ErrNoJob) {
		t.Fatalf("Newest with no files: %v", err)
	}
	old, err := Write(Job{RunID: "old", Coordinator: "127.0.0.1:1", Token: "t1", Started: time.Now().Add(-time.Minute)})
	if err != nil {
		t.Fatal(err)
	}
	f, err := Write(Job{RunID: "new/x", Coordinator: "127.0.0.1:2", Token: "t2"})
	if err != nil {
		t.Fatal(err)
	}
	// A launcher that is gone: its file is ignored and removed.
	dead, err := Write(Job{RunID: "dead", Coordinator: "127.0.0.1:3", Pid: 1 << 30})
	if err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(f.Path())
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("mode: %v %v", st.Mode(), err)
	}
	j, others, err := Newest()
	if err != nil || j.RunID != "new/x" || j.Token != "t2" || others != 1 {
		t.Fatalf("Newest = %+v, %d, %v", j, others, err)
	}
	if _, err := os.Stat(dead.Path()); !os.IsNotExist(err) {
		t.Errorf("the dead launcher's file is still there: %v", err)
	}
	if err := f.Remove(); err != nil {
		t.Fatal(err)
	}
	if j, _, _ := Newest(); j.RunID != "old" {
		t.Fatalf("after removing the newest: %+v", j)
	}
	_ = old.Remove()
}

func TestPick(t *testing.T) {
	jobs := []Job{{RunID: "new"}, {RunID: "mid"}, {RunID: "old"}}
	for _, tc := range []struct {
		runID, want, others string
		err                 error
	}{
		{"", "new", "mid, old", nil},
		{"mid", "mid", "new, old", nil},
		{"old", "old", "new, mid", nil},
		{"gone", "", "new, mid, old", ErrNoSuchRun},
	} {
		j, others, err := Pick(jobs, tc.runID)
		if j.RunID != tc.want || RunIDs(others) != tc.others || !errors.Is(err, tc.err) {
			t.Errorf("Pick(%q) = %q, others %q, %v; want %q, %q, %v", tc.runID, j.RunID, RunIDs(others), err, tc.want, tc.others, tc.err)
		}
	}
	if err := func() error { _, _, err := Pick(jobs, "gone"); return err }(); err == nil || !strings.Contains(err.Error(), "running: new, mid, old") {
		t.Errorf("an unknown run id's error does not list the running ones: %v", err)
	}
	if _, _, err := Pick(nil, ""); !errors.Is(err, ErrNoJob) {
		t.Errorf("Pick(none): %v", err)
	}
}
