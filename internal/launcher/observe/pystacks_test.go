package observe

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/gotrain/gotrain/internal/torchhook"
)

// stacksScript waits in a function whose name the stack must show.
const stacksScript = `import time
def wait_in_a_known_function():
    print("ready", flush=True)
    time.sleep(600)
wait_in_a_known_function()
`

// startHooked starts argv with the hook on its path and waits for its
// "ready"; the process is killed when the test ends.
func startHooked(t *testing.T, tp *TorchProgress, pyDir string, argv ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), "PYTHONPATH="+pyDir, torchhook.EnvDir+"="+tp.Dir())
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || line != "ready\n" {
		t.Fatalf("%v: first line %q, %v", argv, line, err)
	}
	return cmd
}

func TestPythonStacks(t *testing.T) {
	if _, err := exec.LookPath("python3"); err != nil {
		t.Skip("no python3")
	}
	dir := t.TempDir()
	pyDir := filepath.Join(dir, "py")
	tp, err := InstallTorchHook(pyDir, dir)
	if err != nil {
		t.Fatal(err)
	}
	script := filepath.Join(dir, "train.py")
	if err := os.WriteFile(script, []byte(stacksScript), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		argv []string
	}{
		{"the rank's process", []string{"python3", script}},
		// A wrapper that runs the interpreter as its child.
		{"a descendant", []string{"sh", "-c", "python3 " + script + "; true"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmd := startHooked(t, tp, pyDir, tc.argv...)
			st, err := tp.PythonStacks(t.Context(), cmd.Process.Pid)
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(st, " in wait_in_a_known_function\n") || !strings.Contains(st, "most recent call first") {
				t.Errorf("stacks lack the function it waits in:\n%s", st)
			}
			// A second request gets a dump of its own, not the first again.
			again, err := tp.PythonStacks(t.Context(), cmd.Process.Pid)
			if err != nil || strings.Count(again, "wait_in_a_known_function") != strings.Count(st, "wait_in_a_known_function") {
				t.Errorf("second dump: %v\n%s", err, again)
			}
			if cmd.ProcessState != nil || syscall.Kill(cmd.Process.Pid, 0) != nil {
				t.Errorf("the process did not survive its dumps")
			}
		})
	}
}

// A process without the hook is not signalled; nor is one whose stacks
// file names a signal that is not the hook's (the file is the program's).
func TestPythonStacksSendsNoOtherSignal(t *testing.T) {
	dir := t.TempDir()
	tp, err := InstallTorchHook(filepath.Join(dir, "py"), dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, file string
		want       error
	}{
		{"no hook", "", ErrNoStacksHook},
		{"SIGKILL", "gotrain python stacks: signal 9\n", torchhook.ErrNotStacks},
		{"not ours", "hello\n", torchhook.ErrNotStacks},
		// A real-time signal nobody catches would end the process.
		{"not caught", "gotrain python stacks: signal 40\n", ErrNoStacksHook},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmd := exec.Command("sleep", "600")
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			pid := cmd.Process.Pid
			if tc.file != "" {
				if err := os.WriteFile(filepath.Join(tp.Dir(), fmt.Sprintf("%d%s", pid, torchhook.StacksSuffix)), []byte(tc.file), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := tp.PythonStacks(t.Context(), pid); !errors.Is(err, tc.want) {
				t.Errorf("PythonStacks: %v, want %v", err, tc.want)
			}
			// Ended by our SIGTERM, not by a signal sent before it.
			_ = cmd.Process.Signal(syscall.SIGTERM)
			_ = cmd.Wait()
			if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || ws.Signal() != syscall.SIGTERM {
				t.Errorf("the process ended by %v, not by the test's SIGTERM", cmd.ProcessState)
			}
		})
	}
}
