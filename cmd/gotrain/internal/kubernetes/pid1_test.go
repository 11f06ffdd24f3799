package kubernetes

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gotrain/gotrain/internal/testing/testkit"
)

// pid1Env makes the test binary the init of a PID namespace of its own
// (TestMain): it mounts its namespace's /proc and runs RunInit on sh -c
// with the script in pid1Script.
const (
	pid1Env    = "GOTRAIN_TEST_PID1"
	pid1Script = "GOTRAIN_TEST_PID1_SCRIPT"
)

func TestMain(m *testing.M) {
	if os.Getenv(pid1Env) != "" {
		os.Exit(testInit())
	}
	os.Exit(m.Run())
}

// testInit is PID 1 of a new PID and mount namespace.
func testInit() int {
	if os.Getpid() != 1 {
		fmt.Fprintf(os.Stderr, "test init: pid %d, not 1\n", os.Getpid())
		return 90
	}
	if !InitWanted(os.Getenv) {
		fmt.Fprintln(os.Stderr, "test init: InitWanted = false as PID 1")
		return 91
	}
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		fmt.Fprintf(os.Stderr, "test init: make / private: %v\n", err)
		return 92
	}
	if err := unix.Mount("proc", "/proc", "proc", 0, ""); err != nil {
		fmt.Fprintf(os.Stderr, "test init: mount /proc: %v\n", err)
		return 93
	}
	sh, err := exec.LookPath("sh")
	if err != nil {
		return 94
	}
	return RunInit(sh, []string{"sh", "-c", os.Getenv(pid1Script)}, os.Environ(), os.Stderr)
}

// startInit starts this test binary as PID 1 of new PID and mount
// namespaces, running script under RunInit.
func startInit(t *testing.T, script string) (*exec.Cmd, *testkit.Buffer) {
	t.Helper()
	if os.Geteuid() != 0 {
		if os.Getenv("CI") != "" {
			t.Fatal("PID namespaces need root (CI is set: this test must run)")
		}
		t.Skip("PID namespaces need root")
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), pid1Env+"=1", pid1Script+"="+script)
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWPID | syscall.CLONE_NEWNS, Pdeathsig: syscall.SIGKILL}
	out := &testkit.Buffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatalf("start the test init: %v", err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	return cmd, out
}

func exitCode(t *testing.T, cmd *exec.Cmd, out *testkit.Buffer) int {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case <-done:
	case <-time.After(2 * time.Minute):
		t.Fatalf("the init did not exit; output so far:\n%s", out)
	}
	return cmd.ProcessState.ExitCode()
}

// Orphans that end become zombies of PID 1: RunInit reaps them while the
// agent runs, and exits with the agent's status.
func TestInitReapsOrphans(t *testing.T) {
	// Ten orphans end at once (their parent, a subshell, is gone first);
	// the script waits until /proc shows no zombie left (or gives up
	// after 60 s), then exits 7.
	cmd, out := startInit(t, `
for i in 1 2 3 4 5 6 7 8 9 10; do sh -c 'sleep 0.2 &' ; done
sleep 0.5
n=0
while :; do
  z=$(grep -l '^State:[[:space:]]*Z' /proc/[0-9]*/status 2>/dev/null | wc -l)
  [ "$z" = 0 ] && break
  n=$((n+1)); [ $n -gt 600 ] && { echo "zombies left: $z"; exit 1; }
  sleep 0.1
done
echo "no zombies; my parent is $PPID"
exit 7`)
	if code := exitCode(t, cmd, out); code != 7 {
		t.Fatalf("init exited %d; want the agent's 7:\n%s", code, out)
	}
	if !strings.Contains(out.String(), "no zombies; my parent is 1") {
		t.Fatalf("want every orphan reaped and the agent a child of PID 1:\n%s", out)
	}
}

// A SIGTERM to PID 1 (the kubelet's, at pod deletion) reaches the agent,
// and a signal that ends the agent is 128+N.
func TestInitForwardsSIGTERM(t *testing.T) {
	cmd, out := startInit(t, `trap 'echo "got TERM"; exit 143' TERM; echo ready; while :; do sleep 0.05; done`)
	testkit.WaitFor(t, time.Minute, "the ready line", func() bool { return strings.Contains(out.String(), "ready") })
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := exitCode(t, cmd, out); code != 143 || !strings.Contains(out.String(), "got TERM") {
		t.Fatalf("init exited %d; want the agent to get SIGTERM and exit 143:\n%s", code, out)
	}

	cmd, out = startInit(t, `echo ready; kill -USR1 $$; sleep 60`) // USR1 ends sh (no trap)
	if code := exitCode(t, cmd, out); code != 128+int(syscall.SIGUSR1) {
		t.Fatalf("init exited %d; want 128+SIGUSR1:\n%s", code, out)
	}
}
