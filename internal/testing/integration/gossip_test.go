package integration

import (
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestGossipFindsStoppedNode: SIGSTOP the second agent mid-job. Its TCP
// connection to the coordinator stays open, so only gossip (or gRPC
// keepalive, after about 20 s) can tell that it stopped answering; the first
// agent must report the node lost by gossip (within seconds on an idle
// machine: the test logs how long, and checks the cause the message names,
// not the time). Afterwards the stopped agent is killed and nothing of the
// job is left.
func TestGossipFindsStoppedNode(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	a, b, _ := twoNodes(t, false, "--grace-period", "1s", "--max-restarts", "0", "--verbose", "--",
		bin.testprog, "sleep", "--pid-dir", dir)
	waitOutput(t, a, "8 pid files (4 workers, 4 children)", func() bool {
		files, _ := filepath.Glob(filepath.Join(dir, "*.pid"))
		return len(files) >= 8
	})
	for _, j := range []*job{a, b} {
		waitOutput(t, j, "gossip joined", func() bool { return strings.Contains(j.err.String(), "gossip joined") })
	}
	t.Cleanup(func() {
		// Killing a stopped process works; SIGCONT first all the same.
		_ = b.cmd.Process.Signal(syscall.SIGCONT)
		_ = b.cmd.Process.Kill()
		<-b.done
		waitNoLeftovers(t, 10*time.Second)
	})

	stopped := time.Now()
	if err := b.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	waitOutput(t, a, "the lost node named by gossip", func() bool {
		// Out of contact for the node timeout (10 s): then lost.
		return strings.Contains(a.err.String(), "was lost: unreachable for ") && strings.Contains(a.err.String(), "gossip: no answer from 127.0.0.1")
	})
	t.Logf("gossip found the stopped agent in %s", time.Since(stopped).Round(10*time.Millisecond))
	if code := a.wait(t, 30*time.Second); code == 0 {
		t.Errorf("the first agent exited 0")
	}
	if !strings.Contains(a.err.String(), "node node-2 on ") {
		t.Errorf("the first agent's stderr does not name node-2")
	}
	if t.Failed() {
		t.Log(dump(a, b))
	}
}
