package launcher

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gotrain/gotrain/internal/launcher/output"
	"github.com/gotrain/gotrain/internal/launcher/supervise"
	"github.com/gotrain/gotrain/internal/testing/testkit"
)

// runWorker starts spec's /bin/sh -c script as a rank and waits for it.
func runWorker(t *testing.T, spec workerSpec, script string) (p *workerProc, stdout, stderr *testkit.Buffer) {
	t.Helper()
	sup, err := supervise.New(supervise.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	stdout, stderr = &testkit.Buffer{}, &testkit.Buffer{}
	spec.program, spec.args, spec.env = "/bin/sh", []string{"-c", script}, os.Environ()
	p, err = startWorker(sup, spec, output.NewConsole(stdout), output.NewConsole(stderr))
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.done():
	case <-time.After(time.Minute):
		p.signal(9)
		t.Fatal("the worker did not end")
	}
	return p, stdout, stderr
}

// Raw output is the worker's bytes, unchanged: no prefix, no newline added
// to a last line without one (a JSON document on stdout stays one); the
// log file has the same bytes, its own last line on a line of its own, and
// the failure report still gets the stderr lines.
func TestRawOutputIsByteExact(t *testing.T) {
	dir := t.TempDir()
	p, stdout, stderr := runWorker(t, workerSpec{rank: 0, logDir: dir, output: output.Options{Mode: output.Raw}},
		`printf '{"a": [1,\n 2]}'; printf 'line one\nno newline' >&2; exit 4`)
	if got := stdout.String(); got != "{\"a\": [1,\n 2]}" {
		t.Errorf("stdout %q, want the bytes the worker wrote", got)
	}
	if got := stderr.String(); got != "line one\nno newline" {
		t.Errorf("stderr %q, want the bytes the worker wrote", got)
	}
	if got := p.stderr.Snapshot(); !slices.Equal(got, []string{"line one", "no newline"}) {
		t.Errorf("stderr tail %q, want its two lines", got)
	}
	log, err := os.ReadFile(filepath.Join(dir, "rank0.log"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasSuffix(string(log), "\n=== gotrain: rank 0 ended: exit status 4\n") || !strings.Contains(string(log), " 2]}") {
		t.Errorf("rank0.log:\n%s\nwant the output, then the end on a line of its own", log)
	}
}

// torchrun's --redirects and --local-ranks-filter: what a local rank may
// not print goes to its log file only.
func TestConsoleFilters(t *testing.T) {
	script := "echo out; echo err >&2"
	for _, c := range []struct {
		name           string
		local          int
		output         output.Options
		stdout, stderr string
	}{
		{"everything by default", 1, output.Options{}, "[rank 1] out\n", "[rank 1] err\n"},
		{"another local rank's filter", 1, output.Options{ConsoleRanks: []int{0}}, "", ""},
		{"its own local rank in the filter", 1, output.Options{ConsoleRanks: []int{0, 1}}, "[rank 1] out\n", "[rank 1] err\n"},
		{"stdout redirected for all", 1, output.Options{Redirects: output.PerRankStreams{All: output.StdoutOnly}}, "", "[rank 1] err\n"},
		{"both redirected for local rank 1", 1, output.Options{Redirects: output.PerRankStreams{Ranks: map[int]output.Streams{1: output.AllStreams}}}, "", ""},
		{"redirects of another local rank", 1, output.Options{Redirects: output.PerRankStreams{Ranks: map[int]output.Streams{0: output.AllStreams}}}, "[rank 1] out\n", "[rank 1] err\n"},
		{"raw, stderr redirected", 1, output.Options{Mode: output.Raw, Redirects: output.PerRankStreams{All: output.StderrOnly}}, "out\n", ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			_, stdout, stderr := runWorker(t, workerSpec{rank: 1, local: c.local, logDir: dir, output: c.output}, script)
			if stdout.String() != c.stdout || stderr.String() != c.stderr {
				t.Errorf("console stdout %q stderr %q, want %q and %q", stdout.String(), stderr.String(), c.stdout, c.stderr)
			}
			log, err := os.ReadFile(filepath.Join(dir, "rank1.log"))
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(string(log), "\nout\n") || !strings.Contains(string(log), "\nerr\n") {
				t.Errorf("rank1.log:\n%s\nwant both lines whatever the console shows", log)
			}
		})
	}
}

// One rank alone reads gotrain's stdin, in a session of its own so that a
// terminal read does not stop it.
func TestOneRankReadsStdin(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if _, err := w.WriteString("hello\n"); err != nil {
		t.Fatal(err)
	}
	w.Close()
	_, stdout, _ := runWorker(t, workerSpec{rank: 0, stdin: r},
		`read line; read -r pid comm state ppid pgrp session rest < /proc/self/stat; echo "$line $([ "$pgrp" = "$session" ] && echo own-session)"`)
	if got := stdout.String(); got != "[rank 0] hello own-session\n" {
		t.Errorf("stdout %q, want the line read from stdin, in a session of its own", got)
	}
}
