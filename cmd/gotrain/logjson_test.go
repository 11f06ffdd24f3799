package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// With --log-format json (and --verbose, which must not bring logfmt back)
// every line of a failing job's stdout and stderr is one JSON object: the
// records, the restart line, the workers' output (with their rank), and the
// last line, the failure, with the job's exit status.
func TestLogFormatJSONEveryLine(t *testing.T) {
	bin := buildBinary(t)
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "launch", "--nproc-per-node", "2", "--backend", "cpu", "--max-restarts", "1", "--restart-backoff", "0s",
		"--verbose", "--log-format", "json", "--", "sh", "-c", `echo "hello $RANK"; echo "oops $RANK" >&2; sleep 0.2; exit 3`)
	cmd.Dir = t.TempDir()
	cmd.Env = append(os.Environ(), "GOTRAIN_SLURM=off")
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	ee, ok := err.(*exec.ExitError)
	if !ok || ee.ExitCode() != 3 {
		t.Fatalf("exit %v, want 3\nstdout:\n%s\nstderr:\n%s", err, o.String(), e.String())
	}
	type rec struct {
		Time, Level, Msg, Source, Stream string
		Rank                             *int
		ExitCode                         *int `json:"exit_code"`
	}
	parse := func(name, s string) []rec {
		var recs []rec
		for line := range strings.Lines(s) {
			var r rec
			if err := json.Unmarshal([]byte(line), &r); err != nil || !strings.HasPrefix(line, "{") || r.Time == "" || r.Level == "" || r.Msg == "" {
				t.Errorf("%s line %q is no JSON object with time, level and msg: %v", name, line, err)
			}
			recs = append(recs, r)
		}
		return recs
	}
	out, errs := parse("stdout", o.String()), parse("stderr", e.String())
	has := func(recs []rec, what string, f func(rec) bool) {
		for _, r := range recs {
			if f(r) {
				return
			}
		}
		t.Errorf("no %s\nstdout:\n%s\nstderr:\n%s", what, o.String(), e.String())
	}
	has(out, "worker line of rank 1 on stdout", func(r rec) bool {
		return r.Source == "worker" && r.Rank != nil && *r.Rank == 1 && r.Msg == "hello 1" && r.Stream == "stdout"
	})
	has(errs, "worker line of rank 0 on stderr", func(r rec) bool {
		return r.Source == "worker" && r.Rank != nil && *r.Rank == 0 && r.Msg == "oops 0" && r.Stream == "stderr"
	})
	has(errs, "restart line", func(r rec) bool {
		return r.Source == "gotrain" && strings.Contains(r.Msg, "restarting all 2 ranks")
	})
	has(errs, "--verbose record", func(r rec) bool { return r.Msg == "generation started" })
	if len(errs) == 0 {
		return
	}
	last := errs[len(errs)-1]
	if last.Level != "ERROR" || !strings.HasPrefix(last.Msg, "job failed: rank ") || last.ExitCode == nil || *last.ExitCode != 3 {
		t.Errorf("last stderr line %+v: want the job's failure, level ERROR, exit_code 3\nstderr:\n%s", last, e.String())
	}
}

// A usage error after --log-format json is one JSON object too, with its
// hint, and gotrain still exits 2.
func TestLogFormatJSONUsageError(t *testing.T) {
	bin := buildBinary(t)
	stdout, stderr, code := runGotrain(t, bin, "launch", "--log-format", "json", "--nproc-per-node", "1", "--backend", "cpu", "--", "/no/such/program")
	var r struct {
		Level, Msg, Hint string
		ExitCode         *int `json:"exit_code"`
	}
	if code != exitUsage || stdout != "" || strings.Count(stderr, "\n") != 1 || json.Unmarshal([]byte(stderr), &r) != nil ||
		r.Level != "ERROR" || !strings.Contains(r.Msg, "/no/such/program") || r.Hint == "" || r.ExitCode == nil || *r.ExitCode != exitUsage {
		t.Errorf("exit %d, stdout %q, stderr %q: want exit 2 and one JSON object with msg, hint and exit_code 2", code, stdout, stderr)
	}
}

// gotrain torchrun with GOTRAIN_LOG_FORMAT=json: its own lines (the
// interpreter it chose) are JSON objects too, and so is its one rank's raw
// output.
func TestTorchrunLogFormatJSON(t *testing.T) {
	bin := buildBinary(t)
	const realPy = "/usr/bin/python3"
	if _, err := os.Stat(realPy); err != nil {
		t.Skip("no " + realPy)
	}
	dir := t.TempDir()
	script := dir + "/hi.py"
	if err := os.WriteFile(script, []byte("print('hi')\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "torchrun", "--nproc_per_node=1", script)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOTRAIN_SLURM=off", "PYTHON_EXEC="+realPy, "GOTRAIN_LOG_FORMAT=json", "GOTRAIN_STANDBY=off")
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	if err := cmd.Run(); err != nil {
		t.Fatalf("%v\nstdout:\n%s\nstderr:\n%s", err, o.String(), e.String())
	}
	var msgs []string
	for _, s := range []string{o.String(), e.String()} {
		for line := range strings.Lines(s) {
			var r struct{ Msg string }
			if err := json.Unmarshal([]byte(line), &r); err != nil || r.Msg == "" {
				t.Errorf("line %q is no JSON object with a msg: %v", line, err)
			}
			msgs = append(msgs, r.Msg)
		}
	}
	all := strings.Join(msgs, "\n")
	if !strings.Contains(all, "running Python "+realPy+" ($PYTHON_EXEC)") || !strings.Contains(all, "\nhi\n") && !strings.HasPrefix(all, "hi\n") {
		t.Errorf("messages %q: want the interpreter line and the rank's hi", msgs)
	}
}
