package integration

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// gotrain torchrun prints one rank's output as torchrun does: the bytes the
// program wrote (`gotrain torchrun eval.py > out.json` is its JSON), and the
// rank reads gotrain's stdin. Real PyTorch, through the Python standby path.
func TestTorchrunOneRankIsRawAndReadsStdin(t *testing.T) {
	path := needTorch(t)
	dir := t.TempDir()
	script := filepath.Join(dir, "eval.py")
	if err := os.WriteFile(script, []byte(`import json, sys
import torch
line = sys.stdin.readline().strip()
sys.stdout.write(json.dumps({"read": line, "sum": int(torch.arange(4).sum())}, indent=1))
`), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()
	cmd := gotrainCmd(ctx, t, []string{path}, "torchrun", "--nproc_per_node=1", "--standalone", script)
	cmd.Stdin = strings.NewReader("from stdin\n")
	var errb strings.Builder
	cmd.Stderr = &errb
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("gotrain torchrun: %v\nstderr:\n%s", err, errb.String())
	}
	want := "{\n \"read\": \"from stdin\",\n \"sum\": 6\n}"
	if string(out) != want {
		t.Errorf("stdout %q, want exactly the program's %q\nstderr:\n%s", out, want, errb.String())
	}
	var v map[string]any
	if err := json.Unmarshal(out, &v); err != nil {
		t.Errorf("stdout is not JSON: %v", err)
	}
}

// --redirects keeps a local rank's stream off the console, in its log file.
func TestTorchrunRedirects(t *testing.T) {
	logs := t.TempDir()
	script := filepath.Join(t.TempDir(), "hello.py")
	if err := os.WriteFile(script, []byte("import os, sys\nimport torch\nprint('hello from', os.environ['LOCAL_RANK'])\nprint('err from', os.environ['LOCAL_RANK'], file=sys.stderr)\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	r := runTorch(t, 4*time.Minute, "torchrun", "--nproc_per_node=2", "--redirects", "0:1", "--log-dir", logs, script)
	if r.code != 0 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
	}
	if strings.Contains(r.stdout, "hello from 0") || !strings.Contains(r.stdout, "[rank 1] hello from 1") ||
		!strings.Contains(r.stderr, "[rank 0] err from 0") {
		t.Errorf("local rank 0's stdout should be in its log alone, the rest on the console\nstdout:\n%s\nstderr:\n%s", r.stdout, r.stderr)
	}
	found, _ := filepath.Glob(filepath.Join(logs, "*", "attempt-*", "rank0.log"))
	if len(found) != 1 {
		t.Fatalf("rank0.log under %s: %q", logs, found)
	}
	if b, _ := os.ReadFile(found[0]); !strings.Contains(string(b), "hello from 0") {
		t.Errorf("%s:\n%s\nwant rank 0's stdout", found[0], b)
	}
}
