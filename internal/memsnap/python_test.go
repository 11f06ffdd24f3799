//go:build linux

package memsnap

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

const torchScript = `
import os, sys, torch, gotrain_snapshot as gs
mode = sys.argv[1]
torch.manual_seed(0)
model = torch.nn.Linear(64, 32)
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
for _ in range(3):
    model(torch.randn(8, 64)).sum().backward(); opt.step()
if mode == "save":
    assert gs.snapshot({"model": model.state_dict(), "opt": opt.state_dict()}, 7)
    print("saved", float(model.weight.sum()))
else:
    assert gs.source() is None
    got = gs.restore()
    assert got is not None, "no snapshot"
    state, step = got
    _, _, src = gs.restore(with_source=True)
    fresh = torch.nn.Linear(64, 32)
    fresh.load_state_dict(state["model"])
    print("restored", step, float(fresh.weight.sum()), torch.equal(fresh.weight, model.weight), len(state["opt"]["state"]), src, gs.source())
`

// The Python module against the real store, with real torch: one process
// snapshots a model and optimizer and exits; a new one restores them, bit
// for bit, with the step.
func TestPythonModuleWithTorch(t *testing.T) {
	py := "/usr/bin/python3"
	if err := exec.Command(py, "-c", "import torch").Run(); err != nil {
		t.Skipf("no torch for %s: %v", py, err)
	}
	st, run := pythonWorker(t, py, torchScript)
	out, _ := run("save")
	saved := strings.Fields(out)
	if len(st.List()) != 1 || st.List()[0].Step != 7 {
		t.Fatalf("the store holds %+v after the save, want rank 0 at step 7", st.List())
	}
	out, stderr := run("restore")
	// Each restore says where its state came from.
	want := "gotrain_snapshot: rank 0 restored the state of step 7 from this node's agent's memory ("
	if n := strings.Count(stderr, want); n != 2 {
		t.Errorf("stderr has %d lines %q, want 2:\n%s", n, want, stderr)
	}
	restored := strings.Fields(out)
	if len(restored) != 7 || restored[1] != "7" || restored[2] != saved[1] || restored[3] != "True" || restored[4] != "2" || restored[5] != SourceOwn || restored[6] != SourceOwn {
		t.Fatalf("restored %q, want step 7, the saved weights (sum %s) bit for bit, the optimizer's momentum for 2 tensors, and the agent as the source", restored, saved[1])
	}
}

const dcpScript = `
import sys, torch, gotrain_snapshot as gs
import torch.distributed.checkpoint as dcp
mode = sys.argv[1]
torch.manual_seed(0)
model = torch.nn.Linear(64, 32)
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
for _ in range(3):
    model(torch.randn(8, 64)).sum().backward(); opt.step()
def state(m, mom, epoch):
    return {"model": m.state_dict(), "momentum": mom, "meta": {"epoch": epoch}}
saved_mom = {n: opt.state[p]["momentum_buffer"] for n, p in model.named_parameters()}
if mode == "save":
    dcp.save(state(model, saved_mom, 3), storage_writer=gs.dcp_writer(9))
    print("saved")
else:
    fresh = torch.nn.Linear(64, 32)
    st = state(fresh, {n: torch.zeros_like(t) for n, t in saved_mom.items()}, 0)
    r = gs.dcp_reader()
    assert r.found, "no snapshot"
    dcp.load(st, storage_reader=r)
    fresh.load_state_dict(st["model"])
    same = torch.equal(fresh.weight, model.weight) and torch.equal(fresh.bias, model.bias)
    same_mom = all(torch.equal(st["momentum"][n], saved_mom[n]) for n in saved_mom)
    print("restored", r.step, r.source, same, same_mom, st["meta"]["epoch"])
`

// dcpPython is an interpreter whose torch has torch.distributed.checkpoint
// (torch 2.x): GOTRAIN_TEST_PYTHON, the GPU machine's venv, or Debian's.
func dcpPython(t *testing.T) string {
	t.Helper()
	cands := []string{os.Getenv("GOTRAIN_TEST_PYTHON"), "/opt/torch/.venv/bin/python3", "/usr/bin/python3"}
	var why []string
	for _, py := range cands {
		if py == "" {
			continue
		}
		out, err := exec.Command(py, "-c", "import torch, torch.distributed.checkpoint; print(torch.__version__)").CombinedOutput()
		if err == nil {
			return py
		}
		why = append(why, fmt.Sprintf("%s: %v %s", py, err, lastLine(string(out))))
	}
	t.Skipf("no python here has torch.distributed.checkpoint (torch 2.x; Debian 12's torch 1.13 has none), so the DCP writer and reader are tested where one has it, e.g. the GPU machine's torch 2.11 (GOTRAIN_TEST_PYTHON=...): %s", strings.Join(why, "; "))
	return ""
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}

// torch.distributed.checkpoint over the tier: dcp.save with dcp_writer in
// one process, which exits; dcp.load with dcp_reader in a new one restores
// the model, the momentum and a non-tensor value bit for bit, with the step
// and where it came from.
func TestPythonDCPWriterAndReader(t *testing.T) {
	py := dcpPython(t)
	st, run := pythonWorker(t, py, dcpScript)
	if got, _ := run("save"); got != "saved" {
		t.Fatalf("save printed %q", got)
	}
	if l := st.List(); len(l) != 1 || l[0].Step != 9 {
		t.Fatalf("the store holds %+v after dcp.save, want rank 0 at step 9", l)
	}
	out, _ := run("restore")
	if got := strings.Fields(out); len(got) != 6 || got[1] != "9" || got[2] != SourceOwn || got[3] != "True" || got[4] != "True" || got[5] != "3" {
		t.Fatalf("restored %q, want step 9 from the agent, the weights and momentum bit for bit, epoch 3", got)
	}
}

// pythonWorker serves a store on a snapshot socket and returns it with a
// run(mode) that runs script (python -c) with mode as a worker of rank 0
// of this agent would be run, gotrain_snapshot on its path; run returns
// its stdout (trimmed) and stderr, and fails the test if it fails.
func pythonWorker(t *testing.T, py, script string) (*Store, func(mode string) (string, string)) {
	t.Helper()
	st := NewStore(0)
	t.Cleanup(st.Close)
	sock := serve(t, &Server{Store: st, Token: testToken})
	mod := t.TempDir()
	if err := os.WriteFile(filepath.Join(mod, PythonModuleName), PythonModule, 0o644); err != nil {
		t.Fatal(err)
	}
	return st, func(mode string) (string, string) {
		t.Helper()
		cmd := exec.Command(py, "-c", script, mode)
		cmd.Env = append(os.Environ(), "PYTHONPATH="+mod, "GOTRAIN_AGENT="+filepath.Join(filepath.Dir(sock), "agent.sock"),
			"GOTRAIN_JOB_TOKEN="+testToken, "GOTRAIN_RANK=0")
		var stderr strings.Builder
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("python %s: %v\n%s%s", mode, err, out, stderr.String())
		}
		return strings.TrimSpace(string(out)), stderr.String()
	}
}
