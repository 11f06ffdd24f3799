package launcher

import (
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/gotrain/gotrain/internal/launcher/observe"
	"github.com/gotrain/gotrain/internal/launcher/output"
)

// --log-dir followed planted symbolic links (root appended
// into a file another user chose). Nothing in the log dir is opened through
// a link now.
func TestLogFilesNeverFollowLinks(t *testing.T) {
	dir := t.TempDir()
	victim := filepath.Join(t.TempDir(), "victim")
	if err := os.WriteFile(victim, []byte("precious\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(victim, filepath.Join(dir, "rank0.log")); err != nil {
		t.Fatal(err)
	}
	if f, err := openRankLog(dir, 0, 0, ""); err == nil || !errors.Is(err, syscall.ELOOP) {
		f.Close()
		t.Errorf("openRankLog through a planted link: %v", err)
	}
	if b, _ := os.ReadFile(victim); string(b) != "precious\n" {
		t.Errorf("the link's target was written: %q", b)
	}

	// A planted RUN_ID link (to a directory the attacker reads) is refused.
	root := t.TempDir()
	if err := os.Symlink(t.TempDir(), filepath.Join(root, "run-x")); err != nil {
		t.Fatal(err)
	}
	if _, err := output.OpenRunLogDir(root, "run-x"); err == nil {
		t.Error("OpenRunLogDir went through a planted link")
	}
}

// rootCauseReport is what these tests read of a root-cause.json
// (observe.RecordRootCause writes it).
type rootCauseReport struct {
	Succeeded bool            `json:"succeeded"`
	ExitCode  int             `json:"exit_code"`
	Failure   json.RawMessage `json:"failure,omitempty"`
}

// rootCause reads the root-cause.json of the only run under root.
func rootCause(t *testing.T, root string) (rootCauseReport, string) {
	t.Helper()
	m, _ := filepath.Glob(filepath.Join(root, "*", "attempt-*", observe.RootCauseFile))
	if len(m) != 1 {
		t.Fatalf("root-cause.json files under %s: %v", root, m)
	}
	b, err := os.ReadFile(m[0])
	if err != nil {
		t.Fatal(err)
	}
	var r rootCauseReport
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatal(err)
	}
	return r, filepath.Dir(m[0])
}

// A later success never leaves an earlier failure's root cause looking
// current: each run has its directory, and its root-cause.json says how it
// ended, success included.
func TestNoStaleRootCause(t *testing.T) {
	root := t.TempDir()
	failed, out := agentConfig(t, 1, `exit 3`)
	failed.LogDir, failed.RunID = root, "same-id"
	if err := Run(t.Context(), failed); err == nil {
		t.Fatalf("the failing job succeeded\n%s", out)
	}
	r1, dir1 := rootCause(t, root)
	if r1.Succeeded || r1.ExitCode != 3 {
		t.Fatalf("first run: %+v", r1)
	}
	ok, out := agentConfig(t, 1, `echo fine`)
	ok.LogDir, ok.RunID = root, "same-id"
	if err := Run(t.Context(), ok); err != nil {
		t.Fatalf("Run: %v\n%s", err, out)
	}
	if !strings.Contains(out.String(), "gotrain: logs in "+filepath.Join(root, "same-id", "attempt-2")) {
		t.Errorf("the second run does not say where its logs are:\n%s", out)
	}
	b, err := os.ReadFile(filepath.Join(root, "same-id", "attempt-2", observe.RootCauseFile))
	if err != nil {
		t.Fatal(err)
	}
	var r2 rootCauseReport
	if err := json.Unmarshal(b, &r2); err != nil || !r2.Succeeded || r2.ExitCode != 0 || r2.Failure != nil {
		t.Errorf("second run's root-cause.json: %s (%v)", b, err)
	}
	if b, _ := os.ReadFile(filepath.Join(root, "same-id", "attempt-2", "rank0.log")); strings.Count(string(b), "=== gotrain: rank 0, generation") != 1 || strings.Contains(string(b), "exit status 3") {
		t.Errorf("the second run's rank0.log holds more than its own run:\n%s", b)
	}
	if dir1 != filepath.Join(root, "same-id", "attempt-1") {
		t.Errorf("the first run's logs are in %s", dir1)
	}
}

// A log dir removed while the job runs costs the log files, with one
// warning; the restarts that follow start their workers as before.
func TestLogDirRemovedMidJobWarnsOnce(t *testing.T) {
	root := t.TempDir()
	// The first generation removes the logs and fails; the next ones work.
	cfg, out := agentConfig(t, 2, `if [ "$TORCHELASTIC_RESTART_COUNT" = 0 ]; then rm -rf "$LOGROOT"; echo gone; exit 1; fi; echo "generation $TORCHELASTIC_RESTART_COUNT fine"; [ "$TORCHELASTIC_RESTART_COUNT" = 2 ] || exit 1`)
	cfg.Env = append(cfg.Env, "LOGROOT="+root)
	cfg.LogDir, cfg.MaxRestarts = root, 2
	if err := Run(t.Context(), cfg); err != nil {
		t.Fatalf("Run: %v\n%s", err, out)
	}
	if n := strings.Count(out.String(), "cannot write the log files"); n != 1 {
		t.Errorf("%d warnings, want 1:\n%s", n, out)
	}
	if !strings.Contains(out.String(), "[rank 1] generation 2 fine") {
		t.Errorf("the last generation did not run:\n%s", out)
	}
}

// A full disk (a 64 KiB tmpfs) cuts the logs short with one warning and
// never fails the job.
func TestFullDiskWarnsOnce(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("mounting a small tmpfs needs root")
	}
	root := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", root).CombinedOutput(); err != nil {
		t.Skipf("cannot mount a tmpfs here: %v: %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("umount", root).Run() })
	cfg, out := agentConfig(t, 2, `i=0; while [ $i -lt 2000 ]; do echo "line $i of a log that fills the disk ......................"; i=$((i+1)); done`)
	cfg.LogDir = root
	if err := Run(t.Context(), cfg); err != nil {
		t.Fatalf("Run: %v\n%s", err, strings.Join(lastLines(out.String(), 5), "\n"))
	}
	if n := strings.Count(out.String(), "cannot write the log files"); n != 1 {
		t.Errorf("%d warnings, want 1", n)
	}
	if !strings.Contains(out.String(), "[rank 1] line 1999 of") {
		t.Error("the console lost lines")
	}
}

func lastLines(s string, n int) []string {
	l := strings.Split(strings.TrimSpace(s), "\n")
	return l[max(0, len(l)-n):]
}
