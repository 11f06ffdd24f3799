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

// Run as a symlink named torchrun, gotrain is gotrain torchrun: the same
// help, the same usage errors (exit 2), and notes for flags without effect.
func TestTorchrunSymlink(t *testing.T) {
	bin := buildBinary(t)
	link := filepath.Join(t.TempDir(), "torchrun")
	if err := os.Symlink(bin, link); err != nil {
		t.Fatal(err)
	}
	for _, b := range []struct {
		bin  string
		args []string
	}{{bin, []string{"torchrun"}}, {link, nil}} {
		run := func(args ...string) (string, string, int) {
			return runGotrain(t, b.bin, append(append([]string(nil), b.args...), args...)...)
		}
		if stdout, _, code := run("--help"); code != 0 || !strings.HasPrefix(stdout, "Usage: gotrain torchrun") {
			t.Errorf("%s %v --help: exit %d, stdout %q", b.bin, b.args, code, stdout)
		}
		for _, tc := range []struct {
			args []string
			want string
		}{
			{[]string{"--nproc_per_node=2", "--bogus", "t.py"}, "gotrain torchrun: unknown flag --bogus"},
			{[]string{"--nproc-per-node", "two", "t.py"}, `--nproc-per-node "two"`},
			{[]string{"--standalone"}, "no training script given"},
		} {
			stdout, stderr, code := run(tc.args...)
			if code != 2 || stdout != "" || !strings.Contains(stderr, tc.want) {
				t.Errorf("%s %v %v: exit %d, stdout %q, stderr %q; want exit 2 and %q", b.bin, b.args, tc.args, code, stdout, stderr, tc.want)
			}
		}
		// A flag without effect is noted once; the job then runs (here: no
		// such script, so python3 fails, or gotrain says it is missing).
		_, stderr, _ := run("--nproc_per_node=1", "--monitor-interval", "3", "--no-python", "/no/such/program")
		if strings.Count(stderr, "note: --monitor-interval 3 has no effect") != 1 {
			t.Errorf("%s %v --monitor-interval 3: stderr %q, want one note", b.bin, b.args, stderr)
		}
	}
}

// The interpreter is chosen as torchrun's would be: $PYTHON_EXEC, the venv
// of a torchrun symlink, PyTorch's torchrun's; PATH's python3 only when it
// has torch, else a clear error (not every rank failing at import torch).
func TestTorchrunInterpreter(t *testing.T) {
	bin := buildBinary(t)
	const realPy = "/usr/bin/python3"
	if _, err := os.Stat(realPy); err != nil {
		t.Skip("no " + realPy)
	}
	dir := t.TempDir()
	// PATH's python3: a real interpreter without site-packages, so without torch.
	noTorch := filepath.Join(dir, "path")
	if err := os.Mkdir(noTorch, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(noTorch, "python3"), []byte("#!/bin/sh\nexec "+realPy+" -S \"$@\"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	script := filepath.Join(dir, "which.py")
	if err := os.WriteFile(script, []byte("import sys\nprint('EXE=' + sys.executable)\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// A venv whose bin holds gotrain as torchrun.
	venv := filepath.Join(dir, "venv")
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(venv, "bin"), 0o755))
	must(os.WriteFile(filepath.Join(venv, "pyvenv.cfg"), []byte("home = /usr/bin\n"), 0o644))
	must(os.Symlink(realPy, filepath.Join(venv, "bin", "python3")))
	must(os.Symlink(bin, filepath.Join(venv, "bin", "torchrun")))

	run := func(exe string, env []string, args ...string) (string, string, int) {
		t.Helper()
		ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, exe, args...)
		cmd.Env = append(os.Environ(), append([]string{"PATH=" + noTorch, "GOTRAIN_SLURM=off", "PYTHON_EXEC=", "GOTRAIN_STANDBY_PRELOAD="}, env...)...)
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

	_, stderr, code := run(bin, nil, "torchrun", "--nproc_per_node=1", script)
	if code != exitUsage || !strings.Contains(stderr, "PATH's python3 ("+filepath.Join(noTorch, "python3")+") cannot import torch") || !strings.Contains(stderr, "PYTHON_EXEC") {
		t.Errorf("PATH's python3 without torch: exit %d, stderr:\n%s\nwant exit 2 naming it and PYTHON_EXEC", code, stderr)
	}
	stdout, stderr, code := run(bin, []string{"PYTHON_EXEC=" + realPy}, "torchrun", "--nproc_per_node=1", script)
	if code != 0 || !strings.Contains(stdout, "EXE="+realPy) || strings.Count(stderr, "running Python "+realPy+" ($PYTHON_EXEC)") != 1 {
		t.Errorf("PYTHON_EXEC=%s: exit %d, stdout %q, stderr:\n%s\nwant its interpreter, said once", realPy, code, stdout, stderr)
	}
	venvPy := filepath.Join(venv, "bin", "python3")
	stdout, stderr, code = run(filepath.Join(venv, "bin", "torchrun"), nil, "--nproc_per_node=1", script)
	if code != 0 || !strings.Contains(stdout, "EXE="+venvPy) || !strings.Contains(stderr, "running Python "+venvPy+" (the venv of ") {
		t.Errorf("torchrun in a venv: exit %d, stdout %q, stderr:\n%s\nwant the venv's %s", code, stdout, stderr, venvPy)
	}
}
