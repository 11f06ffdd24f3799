package launcher

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/gotrain/gotrain/internal/launcher/output"
	"github.com/gotrain/gotrain/internal/launcher/supervise"
	"github.com/gotrain/gotrain/internal/testing/testkit"
)

// A rank's process prints under "[rank N] ", on the console stream it
// wrote to, into rankN.log between a header and how it ended, and its
// stderr lines are kept for the failure report. (Process supervision
// itself is internal/launcher/supervise's, tested there.)
func TestWorkerOutputIsTheRanks(t *testing.T) {
	dir := t.TempDir()
	p, stdout, stderr := runWorker(t, workerSpec{rank: 3, generation: 2, logDir: dir},
		"echo last words; echo on stderr >&2; printf partial >&2; exit 3")
	if p.exit().ExitCode() != 3 {
		t.Errorf("exit %v, want status 3", p.exit())
	}
	if got := stdout.String(); got != "[rank 3] last words\n" {
		t.Errorf("stdout %q", got)
	}
	if got := stderr.String(); got != "[rank 3] on stderr\n[rank 3] partial\n" {
		t.Errorf("stderr %q", got)
	}
	if got := p.stderr.Snapshot(); !slices.Equal(got, []string{"on stderr", "partial"}) {
		t.Errorf("stderr tail %q", got)
	}
	log, err := os.ReadFile(filepath.Join(dir, "rank3.log"))
	if err != nil {
		t.Fatal(err)
	}
	// stdout and stderr are two pipes: their lines interleave in any order.
	lines := strings.Split(strings.TrimSpace(string(log)), "\n")
	if len(lines) != 5 || !strings.HasPrefix(lines[0], "=== gotrain: rank 3, generation 2, started") ||
		lines[4] != "=== gotrain: rank 3 ended: exit status 3" {
		t.Fatalf("rank3.log:\n%s", log)
	}
	middle := slices.Sorted(slices.Values(lines[1:4]))
	if !slices.Equal(middle, []string{"last words", "on stderr", "partial"}) {
		t.Errorf("rank3.log's lines %q, want the worker's three", middle)
	}
}

// A program that cannot start says what to check.
func TestStartWorkerSaysWhatToCheck(t *testing.T) {
	sup, err := supervise.New(supervise.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	con := output.NewConsole(&testkit.Buffer{})
	_, err = startWorker(sup, workerSpec{rank: 1, program: filepath.Join(t.TempDir(), "nope")}, con, con)
	if err == nil || !strings.Contains(err.Error(), "start rank 1") || !strings.Contains(err.Error(), "check the program path") {
		t.Errorf("err = %v", err)
	}
}
