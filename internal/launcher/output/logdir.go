package output

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
)

// The log directory (--log-dir). Each run writes into a
// directory of its own, LOGDIR/RUN_ID/attempt-N (N: 1, or the first number
// free when a run id is used again with --run-id), so that a run never
// appends to another's rankN.log and a root-cause.json always is its own
// run's. The agent prints where on stderr. Nothing there follows a symbolic
// link: LOGDIR must be a directory of this user's (or root's, as /tmp is,
// and then not writable by others without the sticky bit), RUN_ID a
// directory of this user's that is no link, attempt-N is made by this agent,
// and files are opened with O_NOFOLLOW. What gotrain makes there is its
// user's alone: directories 0700, files 0600 (a rank's output, stack dumps
// and hang evidence may hold what the program printed of its data or
// secrets). A log directory removed while the job runs, or a full disk, is
// warned about once; the job runs on.

// CheckLogRoot makes LOGDIR and checks that no one else can plant files in
// it.
func CheckLogRoot(root string) error {
	if err := os.MkdirAll(root, 0o700); err != nil {
		return fmt.Errorf("create log dir: %w", err)
	}
	st, err := os.Stat(root) // LOGDIR itself may be a link the user made
	if err != nil {
		return fmt.Errorf("log dir: %w", err)
	}
	if !st.IsDir() {
		return fmt.Errorf("--log-dir %s is not a directory", root)
	}
	owner, perm := ownerUID(st), st.Mode()
	switch {
	case owner != os.Getuid() && owner != 0:
		return fmt.Errorf("--log-dir %s belongs to uid %d, not to you (uid %d): its owner could plant links to files of yours there; use a directory of your own", root, owner, os.Getuid())
	case owner != os.Getuid() && perm&0o002 != 0 && perm&fs.ModeSticky == 0:
		return fmt.Errorf("--log-dir %s is writable by every user without the sticky bit: anyone could replace what gotrain makes there; use a directory of your own", root)
	}
	return nil
}

// OpenRunLogDir makes the run's own log directory, LOGDIR/RUN_ID/attempt-N.
func OpenRunLogDir(root, runID string) (string, error) {
	name := strings.Map(func(r rune) rune {
		if r == '/' || r == os.PathSeparator || r == 0 {
			return '_'
		}
		return r
	}, runID)
	if name == "" || name == "." || name == ".." {
		name = "run"
	}
	runDir := filepath.Join(root, name)
	if err := os.Mkdir(runDir, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return "", fmt.Errorf("create the run's log dir: %w", err)
	}
	st, err := os.Lstat(runDir)
	if err != nil {
		return "", fmt.Errorf("the run's log dir: %w", err)
	}
	if !st.IsDir() || st.Mode()&fs.ModeSymlink != 0 || ownerUID(st) != os.Getuid() {
		return "", fmt.Errorf("%s is not a directory of yours (a link or another user's): remove it, or give another --run-id or --log-dir", runDir)
	}
	if st.Mode().Perm()&0o077 != 0 { // made open by an older gotrain, or by hand
		if err := os.Chmod(runDir, 0o700); err != nil {
			return "", fmt.Errorf("%s is open to other users (mode %#o) and cannot be closed: %w; chmod 700 it", runDir, st.Mode().Perm(), err)
		}
	}
	for n := 1; ; n++ {
		dir := filepath.Join(runDir, fmt.Sprintf("attempt-%d", n))
		err := os.Mkdir(dir, 0o700)
		if err == nil {
			return dir, nil
		}
		if !errors.Is(err, fs.ErrExist) || n >= 10000 {
			return "", fmt.Errorf("create the run's log dir: %w", err)
		}
	}
}

// OpenLogFile opens (appending, creating) a file in the run's log dir,
// never through a symbolic link.
func OpenLogFile(path string) (*os.File, error) {
	return os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND|syscall.O_NOFOLLOW, 0o600)
}

// Trouble says once that the log dir cannot be written (removed, full,
// read-only): the job runs on without, or with partial, log files.
type Trouble struct {
	once   sync.Once
	stderr *Console
}

// NewTrouble returns a Trouble that warns on stderr.
func NewTrouble(stderr *Console) *Trouble { return &Trouble{stderr: stderr} }

// Warn warns of err, the first time only.
func (t *Trouble) Warn(err error) {
	if t == nil {
		return
	}
	t.once.Do(func() {
		t.stderr.WriteLine("", []byte(fmt.Sprintf("gotrain: warning: cannot write the log files (%v); the job runs on, and its logs may be incomplete", err)))
	})
}

func ownerUID(st fs.FileInfo) int {
	if s, ok := st.Sys().(*syscall.Stat_t); ok {
		return int(s.Uid)
	}
	return -1
}
