package launcher

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A .py program runs with python3 from PATH, saying so once; a missing
// script is reported before anything starts.
func TestResolvePythonScript(t *testing.T) {
	dir := t.TempDir()
	py := filepath.Join(dir, "python3")
	if err := os.WriteFile(py, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	script := filepath.Join(dir, "train.py")
	if err := os.WriteFile(script, []byte("print(1)\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", dir)
	var stderr bytes.Buffer
	prog, args, err := resolveProgram(script, []string{"--epochs", "3"}, &stderr)
	if err != nil || prog != py || strings.Join(args, " ") != script+" --epochs 3" {
		t.Fatalf("resolveProgram(%s) = %s %q, %v; want %s %s --epochs 3", script, prog, args, err, py, script)
	}
	if n := strings.Count(stderr.String(), "running "+script+" with "+py); n != 1 {
		t.Errorf("stderr %q: want one line saying it runs with python3", stderr.String())
	}
	if _, _, err := resolveProgram(filepath.Join(dir, "nope.py"), nil, &stderr); err == nil || !strings.Contains(err.Error(), "no such file") {
		t.Errorf("a missing script: %v, want no such file", err)
	}
	t.Setenv("PATH", t.TempDir())
	if _, _, err := resolveProgram(script, nil, &stderr); err == nil || !strings.Contains(err.Error(), "python3") {
		t.Errorf("no python3 in PATH: %v, want an error naming python3", err)
	}
}
