package main

import (
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// closeInheritedOnExec marks every descriptor above stderr that gotrain's
// caller left open (a flock lock, the calling shell's pipes) close-on-exec,
// so that workers, standbys and their daemons start with 0, 1 and 2 and the
// files gotrain hands them on purpose, as torchrun's ranks do: an inherited
// lock is not held by a rank after gotrain exits, and `out=$(gotrain …)`
// does not wait for a daemon's copy of a pipe. Descriptors Go opens are
// close-on-exec already; only inherited ones are not.
func closeInheritedOnExec() {
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return // no /proc: nothing to be done without it
	}
	for _, e := range entries {
		fd, err := strconv.Atoi(e.Name())
		if err != nil || fd <= 2 {
			continue
		}
		if flags, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); err == nil && flags&unix.FD_CLOEXEC == 0 {
			_, _ = unix.FcntlInt(uintptr(fd), unix.F_SETFD, flags|unix.FD_CLOEXEC)
		}
	}
}
