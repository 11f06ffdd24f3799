package integration

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gotrain/gotrain/internal/testing/testkit"
)

// A compromised worker runs as its agent's user; through /proc/PPID/mem it
// read the node's key and the job CA's key out of the agent. The agent is
// not dumpable now: the worker's read is refused. Root reads any process's
// memory (CAP_SYS_PTRACE), so as root the job runs as nobody, agent and
// worker alike, as a job of an ordinary user does.
func TestWorkerCannotReadAgentMemory(t *testing.T) {
	t.Parallel()
	gotrain, testprog := bin.gotrain, bin.testprog
	var cred *syscall.Credential
	if os.Getuid() == 0 {
		const nobody = 65534
		dir, err := os.MkdirTemp("", "gotrain-nodump-")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(dir) })
		if err := os.Chmod(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		gotrain, testprog = copyExecutable(t, gotrain, dir), copyExecutable(t, testprog, dir)
		cred = &syscall.Credential{Uid: nobody, Gid: nobody}
	}
	cmd := gotrainCmd(t.Context(), t, nil, "launch", "--nproc-per-node", "1", "--backend", "cpu", "--standby", "off", "--", testprog, "peekparent")
	cmd.Path, cmd.Args[0] = gotrain, gotrain
	cmd.Dir = os.TempDir()
	if cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
		// Where nobody may write: its run files go to /tmp/gotrain-65534.
		var env []string
		for _, kv := range cmd.Env {
			if !strings.HasPrefix(kv, "XDG_RUNTIME_DIR=") && !strings.HasPrefix(kv, "HOME=") {
				env = append(env, kv)
			}
		}
		cmd.Env = append(env, "HOME="+os.TempDir())
	}
	var stdout, stderr testkit.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("gotrain launch: %v\nstdout:\n%s\nstderr:\n%s", err, stdout.String(), stderr.String())
		}
	case <-time.After(2 * time.Minute):
		_ = cmd.Process.Kill()
		<-done
		t.Fatalf("the job did not end within 2 minutes\nstdout:\n%s\nstderr:\n%s", stdout.String(), stderr.String())
	}
	out := stdout.String()
	m := regexp.MustCompile(`peek ppid=(\d+) (open|read)(?: (\d+) bytes)?:? (.*)`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("the worker printed no peek result:\n%s\nstderr:\n%s", out, stderr.String())
	}
	if ppid, _ := strconv.Atoi(m[1]); ppid != cmd.Process.Pid {
		t.Fatalf("the worker's parent is pid %d, not the agent (%d): the test reads the wrong process\n%s", ppid, cmd.Process.Pid, out)
	}
	if m[3] != "" {
		t.Fatalf("the worker read the agent's memory (%s bytes: %s): the agent is dumpable\n%s", m[3], m[4], out)
	}
	if !strings.Contains(m[4], "permission denied") && !strings.Contains(m[4], "operation not permitted") && !strings.Contains(m[4], "input/output error") {
		t.Errorf("the worker's read failed, but not for want of permission (EACCES/EPERM/EIO): %s", m[0])
	}
}

// The standalone coordinator holds the job CA's key: it is not dumpable
// either. A process that is not has its /proc entries owned by root, not
// by its user.
func TestCoordinatorNotDumpable(t *testing.T) {
	t.Parallel()
	gotrain := bin.gotrain
	uid := os.Getuid()
	var cred *syscall.Credential
	if uid == 0 { // root owns a root process's entries anyway: run as nobody
		const nobody = 65534
		dir, err := os.MkdirTemp("", "gotrain-nodump-")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(dir) })
		if err := os.Chmod(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		gotrain, uid = copyExecutable(t, gotrain, dir), nobody
		cred = &syscall.Credential{Uid: nobody, Gid: nobody}
	}
	cmd := gotrainCmd(t.Context(), t, []string{"XDG_RUNTIME_DIR=", "HOME=" + os.TempDir()}, "coordinator", "--listen", "127.0.0.1:0", "--nnodes", "2")
	cmd.Path, cmd.Args[0] = gotrain, gotrain
	cmd.Dir = os.TempDir()
	if cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	}
	var stderr testkit.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	testkit.WaitFor(t, time.Minute, "the coordinator's start line", func() bool { return strings.Contains(stderr.String(), "--coordinator") })
	for _, name := range []string{"mem", "environ"} {
		p := fmt.Sprintf("/proc/%d/%s", cmd.Process.Pid, name)
		st, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if owner := st.Sys().(*syscall.Stat_t).Uid; owner != 0 {
			t.Errorf("%s belongs to uid %d (the coordinator runs as uid %d): the coordinator is dumpable, its memory open to its user's processes", p, owner, uid)
		}
	}
}

// copyExecutable copies the binary at src into dir, mode 0755.
func copyExecutable(t *testing.T, src, dir string) string {
	t.Helper()
	in, err := os.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	dst := filepath.Join(dir, filepath.Base(src))
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_EXCL, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
	return dst
}
