package integration

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gotrain/gotrain/internal/testing/testkit"
)

// The job token was in argv (any local user reads it with
// ps). Given in a --job-token-file, it is in no process's argv while the
// job runs (gotrain, its orphan reaper, the workers, their children), nor
// in gotrain's output or /metrics, and the run id tells nothing of it.
func TestJobTokenInNoArgvLogOrMetrics(t *testing.T) {
	t.Parallel()
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	tok := "tok" + hex.EncodeToString(b)
	tokFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokFile, []byte(tok+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	pids := t.TempDir()
	cmd := gotrainCmd(context.Background(), t, nil, "launch", "--nproc-per-node", "2", "--backend", "cpu", "--grace-period", "1s",
		"--job-token-file", tokFile, "--metrics-addr", "127.0.0.1:0", "--", bin.testprog, "sleep", "--pid-dir", pids)
	var stdout, stderr testkit.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	testkit.WaitFor(t, time.Minute, "4 pid files", func() bool {
		files, _ := filepath.Glob(filepath.Join(pids, "*.pid"))
		return len(files) == 4
	})

	// Every process's argv on this machine.
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	seen := 0
	for _, p := range procs {
		argv, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		seen++
		if bytes.Contains(argv, []byte(tok)) {
			t.Errorf("%s holds the job token: %q", p, bytes.ReplaceAll(argv, []byte{0}, []byte{' '}))
		}
	}
	if seen == 0 {
		t.Fatal("read no /proc/PID/cmdline")
	}

	m := regexp.MustCompile(`metrics at (http://\S+/metrics)`).FindStringSubmatch(stderr.String())
	if m == nil {
		t.Fatalf("no metrics address printed:\n%s", stderr.String())
	}
	resp, err := http.Get(m[1])
	if err != nil {
		t.Fatal(err)
	}
	metrics, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if bytes.Contains(metrics, []byte(tok)) || bytes.Contains(metrics, []byte(tok[:8])) {
		t.Errorf("/metrics holds the token (or its first 8 characters):\n%s", metrics)
	}
	if !regexp.MustCompile(`run_id="gotrain-[0-9a-f]{8}"`).Match(metrics) {
		t.Errorf("/metrics has no random run id:\n%s", metrics)
	}

	_ = cmd.Process.Signal(syscall.SIGTERM)
	_ = cmd.Wait()
	for name, out := range map[string]string{"stdout": stdout.String(), "stderr": stderr.String()} {
		if strings.Contains(out, tok) {
			t.Errorf("gotrain's %s holds the token:\n%s", name, out)
		}
	}
}

// A token file that other users can read is refused, with what to do.
func TestJobTokenFileReadableByOthersRefused(t *testing.T) {
	t.Parallel()
	tokFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokFile, []byte("secret\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(tokFile, 0o644); err != nil { // past the umask
		t.Fatal(err)
	}
	for _, cmd := range [][]string{
		{"launch", "--nproc-per-node", "1", "--backend", "cpu", "--job-token-file", tokFile, "--", bin.testprog, "env"},
		{"coordinator", "--listen", "127.0.0.1:0", "--job-token-file", tokFile},
	} {
		r := launch(t, time.Minute, cmd...)
		if want := fmt.Sprintf("chmod 600 %s", tokFile); r.code != 2 || !strings.Contains(r.stderr, want) {
			t.Errorf("gotrain %s with a 0644 token file: exit %d, want 2 and %q\n%s", cmd[0], r.code, want, r.stderr)
		}
	}
}
