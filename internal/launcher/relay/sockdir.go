package relay

import (
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// The workers' socket lives in a private directory, TMPDIR/gotrain-agent-
// PID-RANDOM (mode 0700, checked), named after the agent's pid so that the
// next agent can tell a leftover: an agent that was SIGKILLed cannot remove
// its directory, and the next one to start removes those of this user whose
// agent is gone.

const socketDirPrefix = "gotrain-agent-"

// MakeSocketDir cleans up after agents that are gone and makes this
// agent's socket directory.
func MakeSocketDir(log *slog.Logger) (string, error) {
	cleanSocketDirs(os.TempDir(), log)
	dir, err := os.MkdirTemp("", fmt.Sprintf("%s%d-", socketDirPrefix, os.Getpid()))
	if err != nil {
		return "", fmt.Errorf("create the agent's socket dir: %w", err)
	}
	st, err := os.Lstat(dir)
	if err != nil || !st.IsDir() || st.Mode().Perm() != 0o700 || ownerUID(st) != os.Getuid() {
		os.RemoveAll(dir)
		return "", fmt.Errorf("the agent's socket dir %s is not a private directory of this user (%v)", dir, err)
	}
	return dir, nil
}

// cleanSocketDirs removes the socket directories in tmp that belong to this
// user and whose agent (the pid in the name) is gone. Others' directories,
// symbolic links and names without a pid are left alone.
func cleanSocketDirs(tmp string, log *slog.Logger) {
	entries, err := os.ReadDir(tmp)
	if err != nil {
		return
	}
	for _, e := range entries {
		rest, ok := strings.CutPrefix(e.Name(), socketDirPrefix)
		if !ok || !e.IsDir() {
			continue
		}
		pidStr, _, ok := strings.Cut(rest, "-")
		pid, err := strconv.Atoi(pidStr)
		if !ok || err != nil || pid <= 0 || processAlive(pid) {
			continue
		}
		p := filepath.Join(tmp, e.Name())
		if st, err := os.Lstat(p); err != nil || !st.IsDir() || ownerUID(st) != os.Getuid() {
			continue
		}
		if err := os.RemoveAll(p); err == nil {
			log.Info("removed the socket dir of an agent that is gone", "dir", p, "pid", pid)
		}
	}
}

func processAlive(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || err == syscall.EPERM
}

func ownerUID(st fs.FileInfo) int {
	if s, ok := st.Sys().(*syscall.Stat_t); ok {
		return int(s.Uid)
	}
	return -1
}
