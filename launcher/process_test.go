package launcher

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/gotrain/gotrain/internal/testkit"
	"github.com/gotrain/gotrain/launcher/supervise"
)

// A rank's process prints under "[rank N] ", on the console stream it
// wrote to, into rankN.log between a header and how it ended, and its
// stderr lines are kept for the failure report. (Process supervision
// itself is launcher/supervise's, tested there.)
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
	if got := p.stderr.snapshot(); !slices.Equal(got, []string{"on stderr", "partial"}) {
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
	con := &console{w: &testkit.Buffer{}}
	_, err = startWorker(sup, workerSpec{rank: 1, program: filepath.Join(t.TempDir(), "nope")}, con, con)
	if err == nil || !strings.Contains(err.Error(), "start rank 1") || !strings.Contains(err.Error(), "check the program path") {
		t.Errorf("err = %v", err)
	}
}

// A survivor resumed under a new rank: its lines go under the new prefix
// into the new rank's file, and its old rank's file ends, saying so.
func TestRouteBecomesAnotherRank(t *testing.T) {
	dir := t.TempDir()
	open := func(rank int) *os.File {
		f, err := openRankLog(dir, rank, 0, "")
		if err != nil {
			t.Fatal(err)
		}
		return f
	}
	var out testkit.Buffer
	con := &console{w: &out}
	rt := &route{prefix: rankPrefix(2), rank: 2, log: open(2)}
	rt.line(con, supervise.Stdout, []byte("as rank 2"))
	rt.become(0, 0, open(0))
	rt.line(con, supervise.Stdout, []byte("as rank 0"))
	rt.close(supervise.Exit{})
	if want := "[rank 2] as rank 2\n[rank 0] as rank 0\n"; out.String() != want {
		t.Errorf("console %q, want %q", out.String(), want)
	}
	read := func(name string) string {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	if r2 := read("rank2.log"); !strings.HasSuffix(r2, "as rank 2\n=== gotrain: rank 2 continues as rank 0\n") {
		t.Errorf("rank2.log:\n%s\nwant its line, then where the rank changed", r2)
	}
	if r0 := read("rank0.log"); !strings.Contains(r0, "\nas rank 0\n=== gotrain: rank 0 ended: ") || strings.Contains(r0, "as rank 2") {
		t.Errorf("rank0.log:\n%s\nwant only the line written as rank 0, then the end", r0)
	}
}
