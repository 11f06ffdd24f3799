package integration

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Another user who made the run-file directory first (/tmp/gotrain-UID:
// anyone can, and the sticky bit keeps the victim from removing it) made
// the first node of a multi-node job without GOTRAIN_JOB_TOKEN exit 1: it
// could not keep the token it made. It keeps it in a private fallback
// beside that directory now, the join line names that file, and the job
// runs.
func TestRunDirTakenByAnotherUser(t *testing.T) {
	t.Parallel()
	planted := filepath.Join(t.TempDir(), "gotrain") // $XDG_RUNTIME_DIR/gotrain of the job
	if os.Getuid() == 0 {
		if err := os.Mkdir(planted, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(planted, 54321, 54321); err != nil {
			t.Fatal(err)
		}
	} else if err := os.Symlink(t.TempDir(), planted); err != nil { // what a user without root can plant
		t.Fatal(err)
	}
	flags := []string{"launch", "--nnodes", "2", "--nproc-per-node", "1", "--backend", "cpu", "--node-addr", "127.0.0.1"}
	first := startSigJob(t, []string{"XDG_RUNTIME_DIR=" + filepath.Dir(planted)}, slices.Concat(flags, []string{"--coordinator-listen", "127.0.0.1:0", "--", "true"})...)
	join := joinArgs(t, first.job) // fails the test when gotrain exits first
	m := joinCommand.FindStringSubmatch(first.err.String())
	dir := filepath.Dir(m[3])
	if dir == planted || !strings.HasPrefix(dir, planted+"-") {
		t.Errorf("the token file %s is not in a fallback beside %s", m[3], planted)
	}
	for p, want := range map[string]os.FileMode{dir: 0o700, m[3]: 0o600} {
		st, err := os.Lstat(p)
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode().Perm() != want || int(st.Sys().(*syscall.Stat_t).Uid) != os.Getuid() {
			t.Errorf("%s: mode %v, owner %d; want %v and uid %d", p, st.Mode().Perm(), st.Sys().(*syscall.Stat_t).Uid, want, os.Getuid())
		}
	}
	second := startJob(t, slices.Concat(flags, join, []string{"--", "true"})...)
	if codes := exits(t, 2*time.Minute, first.job, second); codes[0] != 0 || codes[1] != 0 {
		t.Errorf("exit statuses %v, want 0 and 0\n%s", codes, dump(first.job, second))
	}
}
