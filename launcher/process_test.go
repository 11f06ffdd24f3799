package launcher

import (
	"bytes"
	"os"
	"strings"
	"sync"
	"testing"
	"time"
)

// lockedBuffer is a console's writer that tests can read while pumps write.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func startShell(t *testing.T, script string) (*workerProc, *lockedBuffer) {
	t.Helper()
	out := &lockedBuffer{}
	con := &console{w: out}
	p, err := startWorker(workerSpec{rank: 3, program: "/bin/sh", args: []string{"-c", script}, env: os.Environ()}, con, con)
	if err != nil {
		t.Fatal(err)
	}
	return p, out
}

func waitDone(t *testing.T, p *workerProc, within time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	select {
	case <-p.done:
		return time.Since(start)
	case <-time.After(within):
		p.signal(9)
		t.Fatalf("the worker's exit was not reported within %s", within)
		return 0
	}
}

// A worker without descendants is reported as soon as it exits, with every
// line it printed: the pipe-drain grace does not apply.
func TestWorkerWithoutDescendantsIsReportedAtOnce(t *testing.T) {
	p, out := startShell(t, "echo last words; echo on stderr >&2; exit 3")
	took := waitDone(t, p, drainGrace/2)
	if p.exit.ExitCode() != 3 {
		t.Errorf("exit %v, want status 3", p.exit)
	}
	for _, want := range []string{"[rank 3] last words\n", "[rank 3] on stderr\n"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output %q lacks %q", out.String(), want)
		}
	}
	t.Logf("reported %s after start", took)
}

// A grandchild that left the worker's process group (setsid) and keeps its
// output pipes open neither delays the exit's report by the grace period
// nor blocks it until it ends.
func TestDetachedGrandchildDoesNotHoldTheExit(t *testing.T) {
	if _, err := os.Stat("/usr/bin/setsid"); err != nil {
		t.Skip("needs setsid")
	}
	p, out := startShell(t, "setsid sleep 4 & sleep 0.05; echo parent done; exit 0")
	took := waitDone(t, p, drainGrace)
	if p.exit.ExitCode() != 0 {
		t.Errorf("exit %v", p.exit)
	}
	if !strings.Contains(out.String(), "parent done") {
		t.Errorf("output %q lacks the worker's line", out.String())
	}
	if took > drainGrace/2 {
		t.Errorf("reported after %s; want about %s", took, drainOrphanWait)
	}
}

// Descendants still in the group get the grace period, then the group is
// killed and the exit reported.
func TestDescendantInGroupIsKilledAfterGrace(t *testing.T) {
	if testing.Short() {
		t.Skip("takes the 2 s grace period")
	}
	p, _ := startShell(t, "sleep 30 & exit 0")
	took := waitDone(t, p, 3*drainGrace)
	if took < drainGrace-200*time.Millisecond {
		t.Errorf("reported after %s, before the grace period %s", took, drainGrace)
	}
}
