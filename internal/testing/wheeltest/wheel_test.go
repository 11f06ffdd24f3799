// Package wheeltest builds gotrain's release artefacts as a user gets them
// and runs what they hold: make dist (the wheel, the tarball, SHA256SUMS),
// the wheel installed offline into a fresh virtual environment that sees
// Debian's torch and PyTorch jobs run through it (the gotrain script, python
// -m gotrain, import gotrain under the real torchrun); and the Dockerfile's
// image, built with buildah, whose binary is copied out and run.
package wheeltest

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gotrain/gotrain/internal/wheel"
	"github.com/gotrain/gotrain/python"
)

// systemPython is Debian's interpreter, the one with python3-torch.
const systemPython = "/usr/bin/python3"

func run(t *testing.T, timeout time.Duration, dir string, name string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	// The job's environment, as a user's shell would have it: nothing of
	// this test's build.
	cmd.Env = append(os.Environ(), "PYTHONPATH=")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out.String())
	}
	return out.String()
}

func TestInstalledWheelRunsPyTorchJobs(t *testing.T) {
	if err := exec.Command(systemPython, "-c", "import torch, venv, ensurepip").Run(); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("CI needs %s with torch, venv and pip (python3-torch, python3-venv, python3-pip): %v", systemPython, err)
		}
		t.Skipf("%s lacks torch, venv or pip: %v", systemPython, err)
	}
	root, err := filepath.Abs("../../..")
	if err != nil {
		t.Fatal(err)
	}
	tmp := t.TempDir()
	dist := filepath.Join(tmp, "dist")
	run(t, 10*time.Minute, root, "make", "--no-print-directory", "dist", "DIST="+dist)

	v := python.Version
	whl := filepath.Join(dist, "gotrain-"+v+"-py3-none-manylinux_2_34_x86_64.whl")
	if _, err := os.Stat(whl); err != nil {
		entries, _ := os.ReadDir(dist)
		t.Fatalf("make dist wrote no amd64 wheel for glibc 2.34 (built on Debian 12): %v; dist holds %v", err, entries)
	}
	f, err := os.Open(whl)
	if err != nil {
		t.Fatal(err)
	}
	st, _ := f.Stat()
	if err := wheel.Verify(f, st.Size()); err != nil {
		t.Fatal(err)
	}
	f.Close()
	run(t, time.Minute, dist, "sha256sum", "-c", "SHA256SUMS")
	tarball := run(t, time.Minute, dist, "tar", "-tzf", "gotrain_"+v+"_linux_amd64.tar.gz")
	if strings.TrimSpace(tarball) != "gotrain" {
		t.Errorf("the tarball holds %q, want the binary gotrain alone", tarball)
	}

	venv := filepath.Join(tmp, "venv")
	run(t, 2*time.Minute, tmp, systemPython, "-m", "venv", "--system-site-packages", venv)
	run(t, 2*time.Minute, tmp, filepath.Join(venv, "bin", "python"), "-m", "pip", "install", "--no-index", "--quiet", whl)
	gotrain, py := filepath.Join(venv, "bin", "gotrain"), filepath.Join(venv, "bin", "python")

	t.Run("version", func(t *testing.T) {
		out := run(t, time.Minute, tmp, gotrain, "version")
		if !strings.Contains(out, "gotrain "+v+" (release build)") || !strings.Contains(out, "python package gotrain "+v) {
			t.Errorf("the installed gotrain version says:\n%s\nwant release %s", out, v)
		}
	})

	ddp := filepath.Join(root, "internal", "testing", "integration", "testdata", "ddp_train.py")
	t.Run("gotrain torchrun", func(t *testing.T) {
		out := run(t, 5*time.Minute, tmp, gotrain, "torchrun", "--nproc_per_node", "2", ddp)
		if !strings.Contains(out, "world_size=2") || !strings.Contains(out, "ranks_agree=true") {
			t.Errorf("a gloo DDP job under the installed gotrain torchrun:\n%s", out)
		}
	})

	// The package imported by a program under gotrain takes and restores a
	// snapshot through the agent.
	prog := filepath.Join(tmp, "snap.py")
	if err := os.WriteFile(prog, []byte(`import os, torch, gotrain
w = {"w": torch.arange(4.0) + int(os.environ["RANK"])}
print("snapshot", bool(gotrain.snapshot(w, 7, blocking=True)), flush=True)
got = gotrain.restore_into({"w": torch.zeros(4)})
if got is None:
    print("restored nothing", flush=True)
else:
    state, step = got
    print("restored step", step, "ok", bool(torch.equal(state["w"], w["w"])), flush=True)
`), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Run("python -m gotrain", func(t *testing.T) {
		out := run(t, 5*time.Minute, tmp, py, "-m", "gotrain", "launch", "--nproc-per-node", "2", "--backend", "cpu", "--", py, prog)
		for _, want := range []string{"[rank 0] snapshot True", "[rank 1] snapshot True", "[rank 0] restored step 7 ok True", "[rank 1] restored step 7 ok True"} {
			if !strings.Contains(out, want) {
				t.Errorf("no %q in:\n%s", want, out)
			}
		}
	})

	// Debian's torchrun on Python 3.11 needs --redirects and --tee of one
	// stream: its flag parsing drops 0 and 3 there.
	t.Run("import gotrain under torchrun", func(t *testing.T) {
		out := run(t, 5*time.Minute, tmp, py, "-m", "torch.distributed.run", "--redirects", "2", "--tee", "2", "--nproc_per_node", "2", prog)
		if strings.Count(out, "snapshot False") != 2 || strings.Count(out, "restored nothing") != 2 || !strings.Contains(out, "not running under gotrain") {
			t.Errorf("outside gotrain, snapshot() must return False with a note:\n%s", out)
		}
	})
}
