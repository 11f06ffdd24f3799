package observe

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/gotrain/gotrain/internal/torchhook"
)

// Python stacks of a PyTorch rank, for a hang or straggler verdict: the
// hook armed faulthandler on a signal (torchhook/stacks.go); the agent sends
// it to the rank's process (or the descendant that armed it) and reads what
// was appended to its stacks file.

const (
	// stacksWait bounds the wait for a dump to start: faulthandler writes
	// from its signal handler, at once, unless the process is stopped.
	stacksWait = 3 * time.Second
	// stacksSettle is how long the file must stay the same size for the
	// dump to count as complete.
	stacksSettle = 100 * time.Millisecond
	// maxStacks bounds what is read of one dump.
	maxStacks = 64 << 10
)

// ErrNoStacksHook is PythonStacks' error for a process that has no armed
// hook (not Python, not started by this agent, or the signal is taken).
var ErrNoStacksHook = errors.New("no Python stacks hook in the rank's process")

// PythonStacks asks the hook of the process pid (or of its descendant that
// armed one) for every thread's Python stack.
func (tp *TorchProgress) PythonStacks(ctx context.Context, pid int) (string, error) {
	if tp == nil {
		return "", ErrNoStacksHook
	}
	files, err := torchhook.StacksFiles(tp.dir)
	if err != nil {
		return "", fmt.Errorf("%w: %v", ErrNoStacksHook, err)
	}
	// The rank's own process; else its descendant of lowest pid (the
	// interpreter a wrapper script started).
	target, path := 0, ""
	for p, f := range files {
		if !alive(p) {
			_ = os.Remove(f)
			continue
		}
		if _, ok := tp.rankOf(p, map[int]int{pid: 0}); ok && (target == 0 || p == pid || (target != pid && p < target)) {
			target, path = p, f
		}
	}
	if target == 0 {
		return "", ErrNoStacksHook
	}
	sig, before, err := torchhook.StacksSignal(path)
	if err != nil {
		return "", err
	}
	// The program may have put its own handler in place since, or exec'd
	// another: a real-time signal nobody catches ends the process.
	if !catches(target, sig) {
		return "", fmt.Errorf("%w: pid %d no longer catches signal %d", ErrNoStacksHook, target, int(sig))
	}
	if err := syscall.Kill(target, sig); err != nil {
		return "", fmt.Errorf("signal pid %d: %w", target, err)
	}
	text, err := awaitDump(ctx, path, before)
	if err != nil {
		return "", fmt.Errorf("pid %d: %w", target, err)
	}
	if target != pid {
		text = fmt.Sprintf("(pid %d, a process the rank started)\n%s", target, text)
	}
	return text, nil
}

// awaitDump waits for the file at path to grow past size and stop growing,
// and returns what was added.
func awaitDump(ctx context.Context, path string, size int64) (string, error) {
	deadline := time.Now().Add(stacksWait)
	last, stableSince := size, time.Time{}
	for {
		st, err := os.Stat(path)
		if err != nil {
			return "", err
		}
		now := time.Now()
		switch {
		case st.Size() != last:
			last, stableSince = st.Size(), now
		case last > size && now.Sub(stableSince) >= stacksSettle:
			return readFrom(path, size, last)
		case last == size && now.After(deadline):
			return "", fmt.Errorf("no Python stacks within %s (the process is stopped, or it replaced the hook's signal handler)", stacksWait)
		}
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func readFrom(path string, from, to int64) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	n := min(to-from, maxStacks)
	b := make([]byte, n)
	if _, err := f.ReadAt(b, from); err != nil && !errors.Is(err, io.EOF) {
		return "", err
	}
	s := string(b)
	if to-from > maxStacks {
		s += "\n... (truncated)"
	}
	return s, nil
}

// catches says whether process pid has a handler for sig (/proc's SigCgt).
func catches(pid int, sig syscall.Signal) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return false
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "SigCgt:"); ok {
			mask, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			return err == nil && mask&(1<<(uint(sig)-1)) != 0
		}
	}
	return false
}
