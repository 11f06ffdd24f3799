package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// gotrain launch -- script.py chooses its interpreter by torchrun's rule
// (internal/pyinterp) and says which and why once: $PYTHON_EXEC first; for a
// script that imports torch, PyTorch's torchrun's interpreter or PATH's
// python3 only when it has torch, else exit 2 saying what to set; a script
// without torch runs with PATH's python3.
func TestLaunchInterpreter(t *testing.T) {
	bin := buildBinary(t)
	const realPy = "/usr/bin/python3"
	if _, err := os.Stat(realPy); err != nil {
		t.Skip("no " + realPy)
	}
	dir := t.TempDir()
	write := func(p, s string, mode os.FileMode) string {
		t.Helper()
		if err := os.WriteFile(p, []byte(s), mode); err != nil {
			t.Fatal(err)
		}
		return p
	}
	// PATH's python3: a real interpreter without site-packages, so without
	// torch; it says it ran, since sys.executable is the real one.
	noTorch := filepath.Join(dir, "path")
	withTorchrun := filepath.Join(dir, "path2")
	for _, d := range []string{noTorch, withTorchrun} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
		write(filepath.Join(d, "python3"), "#!/bin/sh\nGOTRAIN_TEST_VIA=path exec "+realPy+" -S \"$@\"\n", 0o755)
	}
	// PyTorch's own torchrun script: its #! names the interpreter with torch.
	write(filepath.Join(withTorchrun, "torchrun"), "#!"+realPy+"\nimport sys\nsys.exit(1)\n", 0o755)
	body := "import os, sys\nprint('EXE=%s VIA=%s' % (sys.executable, os.environ.get('GOTRAIN_TEST_VIA', '')))\n"
	torchScript := write(filepath.Join(dir, "train.py"), "import sys\nif False:\n    import torch.distributed as dist\n"+body, 0o644)
	plainScript := write(filepath.Join(dir, "plain.py"), body, 0o644)

	run := func(path string, env []string, script string) (string, string, int) {
		t.Helper()
		ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, bin, "launch", "--nproc-per-node", "1", "--backend", "cpu", "--standby", "off", "--", script)
		cmd.Env = append(os.Environ(), append([]string{"PATH=" + path, "GOTRAIN_SLURM=off", "PYTHON_EXEC="}, env...)...)
		var o, e bytes.Buffer
		cmd.Stdout, cmd.Stderr = &o, &e
		err := cmd.Run()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		return o.String(), e.String(), code
	}

	_, stderr, code := run(noTorch, nil, torchScript)
	if code != exitUsage || !strings.Contains(stderr, torchScript+" imports torch, but PATH's python3 ("+filepath.Join(noTorch, "python3")+") cannot import torch") || !strings.Contains(stderr, "PYTHON_EXEC") || !strings.Contains(stderr, "-- python3 "+torchScript) {
		t.Errorf("PATH's python3 without torch: exit %d, stderr:\n%s\nwant exit 2 naming it, PYTHON_EXEC and -- python3", code, stderr)
	}
	stdout, stderr, code := run(noTorch, []string{"PYTHON_EXEC=" + realPy}, torchScript)
	if code != 0 || !strings.Contains(stdout, "EXE="+realPy+" VIA=\n") || strings.Count(stderr, "running "+torchScript+" with "+realPy+" ($PYTHON_EXEC)") != 1 {
		t.Errorf("PYTHON_EXEC=%s: exit %d, stdout %q, stderr:\n%s\nwant its interpreter, said once", realPy, code, stdout, stderr)
	}
	stdout, stderr, code = run(withTorchrun, nil, torchScript)
	if code != 0 || !strings.Contains(stdout, "VIA=\n") || strings.Count(stderr, "running "+torchScript+" with "+realPy+" (the interpreter of "+filepath.Join(withTorchrun, "torchrun")) != 1 {
		t.Errorf("PyTorch's torchrun on PATH: exit %d, stdout %q, stderr:\n%s\nwant its interpreter %s, said once", code, stdout, stderr, realPy)
	}
	stdout, stderr, code = run(noTorch, nil, plainScript)
	if code != 0 || !strings.Contains(stdout, "VIA=path\n") || strings.Count(stderr, "running "+plainScript+" with "+filepath.Join(noTorch, "python3")+" (PATH)") != 1 {
		t.Errorf("a script without torch: exit %d, stdout %q, stderr:\n%s\nwant PATH's python3, said once", code, stdout, stderr)
	}
}
