package runfile

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// deadPid is the pid of a process that has ended.
func deadPid(t *testing.T) int {
	t.Helper()
	c := exec.Command("true")
	if err := c.Run(); err != nil {
		t.Fatal(err)
	}
	return c.Process.Pid
}

// The run-file directory's owner was not checked, and a
// SIGKILLed gotrain left its run file (with the token) behind for good.
func TestRunFileDirChecked(t *testing.T) {
	t.Run("open to others is closed", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "gotrain")
		if err := os.Mkdir(dir, 0o777); err != nil {
			t.Fatal(err)
		}
		_ = os.Chmod(dir, 0o777)
		if err := PrivateDir(dir); err != nil {
			t.Fatal(err)
		}
		if st, _ := os.Stat(dir); st.Mode().Perm() != 0o700 {
			t.Errorf("mode %v, want 0700", st.Mode().Perm())
		}
	})
	t.Run("symbolic link refused", func(t *testing.T) {
		base := t.TempDir()
		target := filepath.Join(base, "theirs")
		if err := os.Mkdir(target, 0o700); err != nil {
			t.Fatal(err)
		}
		dir := filepath.Join(base, "gotrain")
		if err := os.Symlink(target, dir); err != nil {
			t.Fatal(err)
		}
		if err := PrivateDir(dir); err == nil || !strings.Contains(err.Error(), "symbolic link") {
			t.Errorf("PrivateDir(symlink) = %v", err)
		}
		t.Setenv("XDG_RUNTIME_DIR", base)
		f, err := Write(Job{RunID: "r", Coordinator: "127.0.0.1:1", Token: "secret"})
		if err != nil {
			t.Fatalf("Write beside a planted symlink: %v", err)
		}
		if filepath.Dir(f.Path()) == dir || filepath.Dir(f.Path()) == target {
			t.Errorf("Write put the token behind a planted symlink: %s", f.Path())
		}
	})
	t.Run("another user's refused", func(t *testing.T) {
		if os.Getuid() != 0 {
			t.Skip("making a directory of another user needs root (chown)")
		}
		base := t.TempDir()
		dir := filepath.Join(base, "gotrain")
		if err := os.Mkdir(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(dir, 54321, 54321); err != nil {
			t.Fatal(err)
		}
		if err := PrivateDir(dir); err == nil || !strings.Contains(err.Error(), "belongs to uid 54321") {
			t.Errorf("PrivateDir(another user's) = %v", err)
		}
	})
}

// A run file another user planted in the directory is not a job of ours.
func TestLiveIgnoresOthersFiles(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("planting a file of another user needs root (chown)")
	}
	t.Setenv("XDG_RUNTIME_DIR", t.TempDir())
	if err := PrivateDir(Dir()); err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(Job{RunID: "planted", Coordinator: "10.6.6.6:29400", Pid: os.Getpid()})
	p := filepath.Join(Dir(), "planted-1.json")
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(p, 54321, 54321); err != nil {
		t.Fatal(err)
	}
	if jobs, _ := Live(); len(jobs) != 0 {
		t.Errorf("Live took a planted run file: %+v", jobs)
	}
}

// What a SIGKILLed launcher left (its run file with the token, a half-written
// one, its token file) is removed when the next one writes its run file;
// a live launcher's files stay.
func TestWriteCleansLeftoversOfDeadLaunchers(t *testing.T) {
	t.Setenv("XDG_RUNTIME_DIR", t.TempDir())
	dead := deadPid(t)
	left, err := Write(Job{RunID: "killed", Coordinator: "127.0.0.1:1", Token: "old-secret", Pid: dead})
	if err != nil {
		t.Fatal(err)
	}
	tok, err := WriteToken("killed", "old-secret")
	if err != nil {
		t.Fatal(err)
	}
	// WriteToken names the file after this process: rename it as the dead one's.
	deadTok := filepath.Join(Dir(), "killed-"+strconv.Itoa(dead)+".token")
	if err := os.Rename(tok.Path(), deadTok); err != nil {
		t.Fatal(err)
	}
	half := filepath.Join(Dir(), "killed-"+strconv.Itoa(dead)+".json.tmp")
	if err := os.WriteFile(half, []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	live, err := Write(Job{RunID: "running", Coordinator: "127.0.0.1:2", Token: "t"})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{left.Path(), deadTok, half} {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("%s is still there: %v", p, err)
		}
	}
	if _, err := Write(Job{RunID: "another", Coordinator: "127.0.0.1:3", Token: "t"}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(live.Path()); err != nil {
		t.Errorf("a live launcher's run file was removed: %v", err)
	}
}

// Another user who makes the run-file directory first (in /tmp anyone can,
// and the sticky bit keeps its owner's victim from removing it) no longer
// stops gotrain: run files and token files go to a private fallback beside
// it, made under a random name, which Dir and Live find and the next Write
// uses again; a fallback-looking directory of another user's is not used.
func TestRunFileDirTakenByAnotherUser(t *testing.T) {
	base := t.TempDir()
	t.Setenv("XDG_RUNTIME_DIR", base)
	primary := filepath.Join(base, "gotrain")
	planted := primary + "-00000000"
	if os.Getuid() == 0 {
		for _, d := range []string{primary, planted} {
			if err := os.Mkdir(d, 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.Chown(d, 54321, 54321); err != nil {
				t.Fatal(err)
			}
		}
	} else { // without root: a link planted where the directory goes
		if err := os.Symlink(t.TempDir(), primary); err != nil {
			t.Fatal(err)
		}
	}
	if err := PrivateDir(primary); err == nil {
		t.Fatal("PrivateDir took a directory that is not ours")
	}
	tok, err := WriteToken("run", "secret")
	if err != nil {
		t.Fatalf("WriteToken with %s taken: %v", primary, err)
	}
	f, err := Write(Job{RunID: "run", Coordinator: "127.0.0.1:1", Token: "secret"})
	if err != nil {
		t.Fatalf("Write with %s taken: %v", primary, err)
	}
	dir := filepath.Dir(f.Path())
	if dir == primary || dir == planted || filepath.Dir(tok.Path()) != dir || !strings.HasPrefix(dir, primary+"-") {
		t.Fatalf("run file in %s, token file in %s: want one fallback %s-XXXX of ours", dir, filepath.Dir(tok.Path()), primary)
	}
	for _, p := range []string{dir, f.Path(), tok.Path()} {
		st, err := os.Lstat(p)
		if err != nil {
			t.Fatal(err)
		}
		want := os.FileMode(0o600)
		if st.IsDir() {
			want = 0o700
		}
		if st.Mode().Perm() != want || ownerOf(st) != os.Getuid() {
			t.Errorf("%s: mode %v owner %d, want %v and uid %d", p, st.Mode().Perm(), ownerOf(st), want, os.Getuid())
		}
	}
	if Dir() != dir {
		t.Errorf("Dir() = %s, want the fallback %s", Dir(), dir)
	}
	if j, _, err := Newest(); err != nil || j.Path != f.Path() {
		t.Errorf("Newest() = %+v, %v: want the job in the fallback", j, err)
	}
	g, err := Write(Job{RunID: "again", Coordinator: "127.0.0.1:2", Token: "t"})
	if err != nil || filepath.Dir(g.Path()) != dir {
		t.Errorf("a second Write went to %v (%v), want the same fallback %s", g, err, dir)
	}
}
