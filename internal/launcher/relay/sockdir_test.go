package relay

import (
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
)

// A SIGKILLed agent left its socket directory behind for
// good. The next agent removes this user's socket directories whose agent
// is gone, and nothing else.
func TestSocketDirsOfGoneAgentsRemoved(t *testing.T) {
	tmp := t.TempDir()
	c := exec.Command("true")
	if err := c.Run(); err != nil {
		t.Fatal(err)
	}
	dead := c.Process.Pid
	mk := func(name string) string {
		p := filepath.Join(tmp, name)
		if err := os.Mkdir(p, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(p, "agent.sock"), nil, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	gone := mk(socketDirPrefix + strconv.Itoa(dead) + "-123")
	live := mk(socketDirPrefix + strconv.Itoa(os.Getpid()) + "-456")
	old := mk(socketDirPrefix + "789") // the old naming: no pid, left alone
	other := filepath.Join(tmp, "unrelated-"+strconv.Itoa(dead)+"-1")
	if err := os.Mkdir(other, 0o700); err != nil {
		t.Fatal(err)
	}
	var foreign string
	if os.Getuid() == 0 {
		foreign = mk(socketDirPrefix + strconv.Itoa(dead) + "-999")
		if err := os.Chown(foreign, 54321, 54321); err != nil {
			t.Fatal(err)
		}
	}
	cleanSocketDirs(tmp, slog.New(slog.DiscardHandler))
	if _, err := os.Stat(gone); !os.IsNotExist(err) {
		t.Errorf("the gone agent's socket dir is still there: %v", err)
	}
	for _, p := range []string{live, old, other, foreign} {
		if p == "" {
			continue
		}
		if _, err := os.Stat(p); err != nil {
			t.Errorf("%s was removed: %v", p, err)
		}
	}
}

// The agent's own socket dir is private and carries its pid.
func TestMakeSocketDir(t *testing.T) {
	t.Setenv("TMPDIR", t.TempDir())
	dir, err := MakeSocketDir(slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	st, err := os.Stat(dir)
	if err != nil || st.Mode().Perm() != 0o700 {
		t.Fatalf("%s: %v %v", dir, st.Mode(), err)
	}
	if want := socketDirPrefix + strconv.Itoa(os.Getpid()) + "-"; filepath.Base(dir)[:len(want)] != want {
		t.Errorf("%s does not start with %s", dir, want)
	}
}
