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
		var stderr strings.Builder
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("python %s: %v\n%s%s", mode, err, out, stderr.String())
		}
		if mode == "restore" {
			// Each restore says where its state came from.
			want := "gotrain_snapshot: rank 0 restored the state of step 7 from this node's agent's memory ("
			if n := strings.Count(stderr.String(), want); n != 2 {
				t.Errorf("stderr has %d lines %q, want 2:\n%s", n, want, stderr.String())
			}
		}
		return strings.TrimSpace(string(out))
	}
	saved := strings.Fields(run("save"))
	if len(st.List()) != 1 || st.List()[0].Step != 7 {
		t.Fatalf("the store holds %+v after the save, want rank 0 at step 7", st.List())
	}
	restored := strings.Fields(run("restore"))
	if len(restored) != 7 || restored[1] != "7" || restored[2] != saved[1] || restored[3] != "True" || restored[4] != "2" || restored[5] != SourceOwn || restored[6] != SourceOwn {
		t.Fatalf("restored %q, want step 7, the saved weights (sum %s) bit for bit, the optimizer's momentum for 2 tensors, and the agent as the source", restored, saved[1])
	}
}
