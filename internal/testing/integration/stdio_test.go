package integration

import (
	"bytes"
	"context"
	"io"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gotrain/gotrain/internal/testing/testkit"
)

// A worker starts with stdin, stdout and stderr alone, whatever gotrain's
// caller left open: a descriptor gotrain inherits (fd 3 here, as `flock L
// gotrain …` or a shell's pipe leave one) reaches no rank, so once gotrain
// exits nothing holds it and its reader sees EOF.
func TestWorkersInheritNoStrayDescriptor(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	// The shell lists its own descriptors (ls is its child: `; true` keeps
	// the shell from exec'ing it), and leaves a daemon behind that would
	// hold whatever the shell holds.
	cmd := gotrainCmd(ctx, t, nil, "launch", "--nproc-per-node", "1", "--backend", "cpu", "--",
		"/bin/sh", "-c", "ls /proc/$$/fd; (sleep 600 &) ; true")
	cmd.ExtraFiles = []*os.File{w}
	var out, errb testkit.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	w.Close()
	if err := cmd.Wait(); err != nil {
		t.Fatalf("gotrain: %v\nstdout:\n%s\nstderr:\n%s", err, out.String(), errb.String())
	}
	var fds []string
	for _, l := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		fds = append(fds, strings.TrimPrefix(l, "[rank 0] "))
	}
	if !slices.Equal(fds, []string{"0", "1", "2"}) {
		t.Errorf("the worker's descriptors %q, want 0 1 2 alone\nstderr:\n%s", fds, errb.String())
	}
	eof := make(chan error, 1)
	go func() { _, err := io.ReadAll(r); eof <- err }()
	select {
	case err := <-eof:
		if err != nil {
			t.Errorf("reading the inherited pipe: %v", err)
		}
	case <-ctx.Done():
		t.Fatal("the pipe gotrain inherited is still held after it exited: a worker or its daemon has it")
	}
}

// One rank alone reads gotrain's stdin (torchrun's behaviour: input() and
// breakpoint() in a debug run); with two, every rank's stdin is /dev/null.
func TestOneRankReadsGotrainsStdin(t *testing.T) {
	run := func(nproc, script string) result {
		ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
		defer cancel()
		cmd := gotrainCmd(ctx, t, nil, "launch", "--nproc-per-node", nproc, "--backend", "cpu", "--", "/bin/sh", "-c", script)
		cmd.Stdin = strings.NewReader("hello\n")
		var out, errb testkit.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		err := cmd.Run()
		if err != nil {
			t.Fatalf("gotrain --nproc-per-node %s: %v\nstderr:\n%s", nproc, err, errb.String())
		}
		return result{stdout: out.String(), stderr: errb.String()}
	}
	script := `if read line; then echo "read $line"; else echo "read nothing"; fi`
	if r := run("1", script); r.stdout != "[rank 0] read hello\n" {
		t.Errorf("one rank printed %q, want the line from gotrain's stdin", r.stdout)
	}
	r := run("2", script)
	for _, want := range []string{"[rank 0] read nothing\n", "[rank 1] read nothing\n"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("two ranks printed %q, want %q (stdin /dev/null)", r.stdout, want)
		}
	}
}

// --output raw passes a worker's bytes through unchanged: its stdout is the
// program's, a last line without a newline included.
func TestRawOutputIsTheProgramsBytes(t *testing.T) {
	doc := "{\"loss\": [0.5,\n 0.25]}"
	r := launch(t, 2*time.Minute, "launch", "--nproc-per-node", "1", "--backend", "cpu", "--output", "raw", "--",
		"/bin/sh", "-c", "printf '%s' '"+doc+"'")
	if r.code != 0 || !bytes.Equal([]byte(r.stdout), []byte(doc)) {
		t.Errorf("exit %d, stdout %q, want 0 and exactly %q\nstderr:\n%s", r.code, r.stdout, doc, r.stderr)
	}
}
