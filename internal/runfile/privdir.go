package runfile

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// The run-file directory holds job tokens, so no one else may read it or
// put files into it: in /tmp another user could make
// /tmp/gotrain-UID first, read the tokens written there, or plant a run file
// that sends gotrain diagnose, with its token, to a coordinator of theirs.

// PrivateDir makes dir (mode 0700), or checks the one that is there: a
// directory, not a symbolic link, owned by this user. One of ours that
// others may enter is made 0700 again; anything else is refused with what
// to do.
func PrivateDir(dir string) error {
	err := os.Mkdir(dir, 0o700)
	if errors.Is(err, fs.ErrNotExist) {
		if err = os.MkdirAll(filepath.Dir(dir), 0o755); err == nil {
			err = os.Mkdir(dir, 0o700)
		}
	}
	if err != nil && !errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("create %s: %w", dir, err)
	}
	st, err := os.Lstat(dir)
	if err != nil {
		return err
	}
	switch {
	case st.Mode()&fs.ModeSymlink != 0:
		return fmt.Errorf("%w: %s is a symbolic link, not a directory of yours: remove it (someone may have planted it)", errNotOurs, dir)
	case !st.IsDir():
		return fmt.Errorf("%w: %s is not a directory: remove it", errNotOurs, dir)
	}
	if uid := ownerOf(st); uid != os.Getuid() {
		return fmt.Errorf("%w: %s belongs to uid %d, not to you (uid %d): another user may read or plant files there; remove it, or set XDG_RUNTIME_DIR to a directory of yours", errNotOurs, dir, uid, os.Getuid())
	}
	if st.Mode().Perm()&0o077 != 0 {
		if err := os.Chmod(dir, 0o700); err != nil {
			return fmt.Errorf("%s is open to other users (mode %#o) and cannot be closed: %w; chmod 700 it", dir, st.Mode().Perm(), err)
		}
	}
	return nil
}

// errNotOurs: the path is not a directory of this user's (another user's,
// a symbolic link, a file): MakeDir goes to a fallback of its own.
var errNotOurs = errors.New("not a directory of yours")

// MakeDir returns the directory for run files and token files, made
// private: Dir's, or, when that path is taken by something not ours (in
// /tmp any user can make /tmp/gotrain-UID first, and the sticky bit keeps
// us from removing it), a fallback next to it, DIR-XXXXXXXX, made with a
// random name that no one can take in advance; a fallback made earlier
// is used again. Dir and Live find the fallback too.
func MakeDir() (string, error) {
	primary := primaryDir()
	err := PrivateDir(primary)
	if err == nil || !errors.Is(err, errNotOurs) {
		return primary, err
	}
	if own := ownFallbacks(primary); len(own) > 0 {
		return own[0], nil
	}
	dir, merr := os.MkdirTemp(filepath.Dir(primary), filepath.Base(primary)+"-")
	if merr != nil {
		return "", fmt.Errorf("%w; and no private directory could be made beside it: %w", err, merr)
	}
	return dir, nil
}

// ownFallbacks lists the fallbacks of primary (primary-*) that are private
// directories of this user's, oldest name first. Another user's, a link or
// one that others may enter is not one.
func ownFallbacks(primary string) []string {
	paths, _ := filepath.Glob(primary + "-*")
	var out []string
	for _, p := range paths {
		if st, err := os.Lstat(p); err == nil && st.IsDir() && ownerOf(st) == os.Getuid() && st.Mode().Perm()&0o077 == 0 {
			out = append(out, p)
		}
	}
	return out
}

// usable reports whether dir is absent or a directory of this user's.
func usable(dir string) bool {
	st, err := os.Lstat(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return true
	}
	return err == nil && st.IsDir() && ownerOf(st) == os.Getuid()
}

func ownerOf(st fs.FileInfo) int {
	if s, ok := st.Sys().(*syscall.Stat_t); ok {
		return int(s.Uid)
	}
	return -1
}

// ownedByMe reports whether path is a regular file of this user (not a
// symbolic link).
func ownedByMe(path string) bool {
	st, err := os.Lstat(path)
	return err == nil && st.Mode().IsRegular() && ownerOf(st) == os.Getuid()
}

// Clean removes what launchers that are gone left in dir: their run files
// (which hold the job token), half-written ones, and their token files. A
// file's launcher is the PID its name ends with (RUN_ID-PID.json,
// RUN_ID-PID.token); files of other users are left alone.
func Clean(dir string) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	for _, e := range entries {
		name := e.Name()
		base, ok := strings.CutSuffix(name, ".json")
		if !ok {
			if base, ok = strings.CutSuffix(name, ".json.tmp"); !ok {
				base, ok = strings.CutSuffix(name, ".token")
			}
		}
		if !ok {
			continue
		}
		i := strings.LastIndexByte(base, '-')
		pid, err := strconv.Atoi(base[i+1:])
		if i < 0 || err != nil || alive(pid) {
			continue
		}
		if p := filepath.Join(dir, name); ownedByMe(p) {
			_ = os.Remove(p)
		}
	}
}
