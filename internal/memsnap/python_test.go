//go:build linux

package memsnap

import (
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
    got = gs.restore()
    assert got is not None, "no snapshot"
    state, step = got
    fresh = torch.nn.Linear(64, 32)
    fresh.load_state_dict(state["model"])
    print("restored", step, float(fresh.weight.sum()), torch.equal(fresh.weight, model.weight), len(state["opt"]["state"]))
`

// The Python module against the real store, with real torch: one process
// snapshots a model and optimizer and exits; a new one restores them, bit
// for bit, with the step.
func TestPythonModuleWithTorch(t *testing.T) {
	py := "/usr/bin/python3"
	if err := exec.Command(py, "-c", "import torch").Run(); err != nil {
		t.Skipf("no torch for %s: %v", py, err)
	}
	st := NewStore(0)
	defer st.Close()
	sock := serve(t, &Server{Store: st, Token: testToken})
	mod := t.TempDir()
	if err := os.WriteFile(filepath.Join(mod, PythonModuleName), PythonModule, 0o644); err != nil {
		t.Fatal(err)
	}
	run := func(mode string) string {
		cmd := exec.Command(py, "-c", torchScript, mode)
		cmd.Env = append(os.Environ(), "PYTHONPATH="+mod, "GOTRAIN_AGENT="+filepath.Join(filepath.Dir(sock), "agent.sock"),
			"GOTRAIN_JOB_TOKEN="+testToken, "GOTRAIN_RANK=0")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("python %s: %v\n%s", mode, err, out)
		}
		return strings.TrimSpace(string(out))
	}
	saved := strings.Fields(run("save"))
	if len(st.List()) != 1 || st.List()[0].Step != 7 {
		t.Fatalf("the store holds %+v after the save, want rank 0 at step 7", st.List())
	}
	restored := strings.Fields(run("restore"))
	if len(restored) != 5 || restored[1] != "7" || restored[2] != saved[1] || restored[3] != "True" || restored[4] != "2" {
		t.Fatalf("restored %q, want step 7, the saved weights (sum %s) bit for bit and the optimizer's momentum for 2 tensors", restored, saved[1])
	}
}
