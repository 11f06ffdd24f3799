package integration

import (
	"fmt"
	"net"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gotrain/gotrain/internal/connguard/connguardtest"
	"github.com/gotrain/gotrain/internal/launcher/snaptier"
)

// The agent's log line naming its snapshot peer port (internal/launcher/snapshots.go).
var peerPortLine = regexp.MustCompile(`msg="snapshot peer port listening" .*addr=(127\.0\.0\.1:\d+)`)

// The snapshot peer port, open in every multi-node job, had no
// connection bound and no handshake deadline: a flood of silent
// connections took all of the agent's descriptors, and the next worker
// crash failed (open /dev/null: too many open files; the job exited 127).
// Here the second agent may hold 1024 descriptors (prlimit: small enough
// that the flood's 3600 connections would take them all), a flood from 9
// addresses stays open against its peer port, and one of its workers is
// SIGKILLed: the job restarts from its checkpoint and finishes, and at most
// the port's unauthenticated budget of the flood stays open.
func TestSnapshotPeerFloodLeavesJobRestarting(t *testing.T) {
	if testing.Short() {
		t.Skip("trains MNIST under a flood")
	}
	raiseFileLimit(t, 8192)
	ckpt := t.TempDir()
	a, b, _ := twoNodes(t, false, "--verbose", "--max-restarts", "3", "--grace-period", "3s", "--",
		bin.mnist, "--epochs", "30", "--checkpoint-dir", ckpt, "--checkpoint-every", "100")
	t.Cleanup(func() {
		if t.Failed() {
			t.Log(dump(a, b))
		}
	})
	var addr string
	waitOutput(t, b, "the second agent's snapshot peer port", func() bool {
		m := peerPortLine.FindStringSubmatch(b.err.String())
		if m != nil {
			addr = m[1]
		}
		return m != nil
	})
	lim := unix.Rlimit{Cur: 1024, Max: 1024}
	if err := unix.Prlimit(b.cmd.Process.Pid, unix.RLIMIT_NOFILE, &lim, nil); err != nil {
		t.Fatalf("lower the second agent's descriptor limit: %v", err)
	}
	waitOutput(t, a, "4 workers and a checkpoint", func() bool {
		return len(descendants(a.cmd.Process.Pid, bin.mnist))+len(descendants(b.cmd.Process.Pid, bin.mnist)) == 4 && checkpoints(ckpt) > 0
	})

	var flood []net.Conn
	for i := range 9 {
		flood = append(flood, connguardtest.Flood(t, fmt.Sprintf("127.0.0.%d", 2+i), addr, 400)...)
	}
	if open := connguardtest.StillOpen(flood, snaptier.MaxPeerPending, time.Minute); open > snaptier.MaxPeerPending {
		t.Errorf("%d of %d flood connections to the peer port still open, want at most %d", open, len(flood), snaptier.MaxPeerPending)
	}

	workers := descendants(b.cmd.Process.Pid, bin.mnist)
	if len(workers) == 0 {
		t.Fatal("no worker of the second node to kill")
	}
	if err := syscall.Kill(workers[0], syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	for i, code := range exits(t, 5*time.Minute, a, b) {
		if code != 0 {
			t.Fatalf("agent %d exited %d during the peer-port flood", i+1, code)
		}
	}
	out := a.out.String() + b.out.String()
	if n := strings.Count(out, "[rank 0] resumed at epoch"); n != 1 {
		t.Errorf("%d resumes, want 1 (the worker's crash restarts the job once)", n)
	}
	if m := finalLine.FindStringSubmatch(a.out.String()); m == nil || m[2] != "true" {
		t.Errorf("no final line with ranks_agree=true from rank 0")
	}
	if strings.Contains(b.err.String(), "too many open files") {
		t.Errorf("the second agent ran out of descriptors:\n%s", b.err.String())
	}
}
