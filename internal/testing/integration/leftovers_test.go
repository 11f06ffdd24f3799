package integration

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/gotrain/gotrain/internal/testing/testkit"
)

// A SIGKILLed gotrain left its socket directory and its
// run file (with the job token) behind for good. The next gotrain to start
// removes them.
func TestLeftoversOfSIGKILLedLaunchCleanedAtNextStart(t *testing.T) {
	t.Parallel()
	// A short TMPDIR: a unix socket's path has at most 107 bytes.
	tmp, err := os.MkdirTemp("", "gl")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(tmp) })
	runtime, pids := t.TempDir(), t.TempDir()
	env := []string{"TMPDIR=" + tmp, "XDG_RUNTIME_DIR=" + runtime}
	cmd := gotrainCmd(context.Background(), t, env, "launch", "--nproc-per-node", "1", "--backend", "cpu",
		"--", bin.testprog, "sleep", "--pid-dir", pids)
	var stderr testkit.Buffer
	cmd.Stdout, cmd.Stderr = &stderr, &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("the first gotrain's output:\n%s", stderr.String())
		}
	})
	leftovers := func() []string {
		socks, _ := filepath.Glob(filepath.Join(tmp, "gotrain-agent-*"))
		runs, _ := filepath.Glob(filepath.Join(runtime, "gotrain", "*.json"))
		return append(socks, runs...)
	}
	testkit.WaitFor(t, time.Minute, "the job's socket dir and run file", func() bool {
		files, _ := filepath.Glob(filepath.Join(pids, "*.pid"))
		return len(files) == 2 && len(leftovers()) == 2
	})
	_ = cmd.Process.Kill() // SIGKILL: nothing of gotrain's own cleanup runs
	_ = cmd.Wait()
	left := leftovers()
	if len(left) != 2 {
		t.Fatalf("after SIGKILL: %v; want its socket dir and run file", left)
	}

	r := func() result {
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		defer cancel()
		c := gotrainCmd(ctx, t, env, "launch", "--nproc-per-node", "1", "--backend", "cpu", "--", bin.testprog, "env")
		out, err := c.CombinedOutput()
		if err != nil {
			return result{code: -1, stderr: fmt.Sprintf("%v\n%s", err, out)}
		}
		return result{}
	}()
	if r.code != 0 {
		t.Fatalf("the next launch: %s", r.stderr)
	}
	if left := leftovers(); len(left) != 0 {
		t.Errorf("the SIGKILLed gotrain's leftovers are still there: %v", left)
	}
}
