package torchhook

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"strings"
	"syscall"
)

// Python stacks (sitecustomize.py, part 4): the hook arms faulthandler on a
// real-time signal and appends every thread's stack to DIR/PID.stacks when
// it comes. The file's first line names the signal; it is the program's
// file, so the signal is checked before anyone sends it.

// StacksSuffix ends the name of a process's stacks file.
const StacksSuffix = ".stacks"

// stacksHeader starts a stacks file's first line.
const stacksHeader = "gotrain python stacks: signal "

// Real-time signals on Linux: the hook uses one of these (SIGRTMIN+6, as
// glibc counts), never a signal whose default action is other than to end
// the process, nor one a program or scheduler commonly uses.
const (
	minRTSignal = 34
	maxRTSignal = 64
)

// StacksFiles lists the stacks files in dir by the pid that armed each.
func StacksFiles(dir string) (map[int]string, error) { return listBySuffix(dir, StacksSuffix) }

// ErrNotStacks is StacksSignal's error for a file that is not a stacks
// file the hook wrote.
var ErrNotStacks = errors.New("torchhook: not a stacks file")

// StacksSignal reads the signal the hook armed from the stacks file at
// path, and the file's size now (where the next dump will start).
func StacksSignal(path string) (sig syscall.Signal, size int64, err error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, 0, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return 0, 0, err
	}
	line, err := bufio.NewReader(f).ReadString('\n')
	if err != nil {
		return 0, 0, fmt.Errorf("%w: %s: no first line", ErrNotStacks, path)
	}
	rest, ok := strings.CutPrefix(strings.TrimSuffix(line, "\n"), stacksHeader)
	var n int
	if !ok || len(rest) > 2 {
		return 0, 0, fmt.Errorf("%w: %s: first line %q", ErrNotStacks, path, line)
	}
	if _, err := fmt.Sscanf(rest, "%d", &n); err != nil || n < minRTSignal || n > maxRTSignal {
		return 0, 0, fmt.Errorf("%w: %s: signal %q is not a real-time signal", ErrNotStacks, path, rest)
	}
	return syscall.Signal(n), st.Size(), nil
}
