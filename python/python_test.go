//go:build linux

package python_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gotrain/gotrain/internal/memsnap"
	"github.com/gotrain/gotrain/python"
)

const testToken = "test-token"

// torchPython is Debian's interpreter when it has torch (CI installs it);
// the tests fail rather than skip under CI without it.
func torchPython(t *testing.T) string {
	t.Helper()
	py := "/usr/bin/python3"
	if err := exec.Command(py, "-c", "import torch").Run(); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("no torch for %s under CI: %v (apt-get install python3-torch)", py, err)
		}
		t.Skipf("no torch for %s: %v", py, err)
	}
	return py
}

// worker serves a store on a snapshot socket and returns it with a
// run(args...) that runs script (python -c) as rank 0 of this agent's
// worker would be run, the package on its path; run returns stdout
// (trimmed) and stderr and fails the test if the script fails.
func worker(t *testing.T, py, script string) (*memsnap.Store, func(args ...string) (string, string)) {
	t.Helper()
	return workerLimited(t, py, script, 0)
}

// workerLimited is worker with a store that holds at most limit bytes.
func workerLimited(t *testing.T, py, script string, limit int64) (*memsnap.Store, func(args ...string) (string, string)) {
	t.Helper()
	st := memsnap.NewStore(limit)
	t.Cleanup(st.Close)
	sock := filepath.Join(t.TempDir(), memsnap.SocketName)
	lis, err := memsnap.Listen(sock)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	srv := &memsnap.Server{Store: st, Token: testToken}
	go func() { done <- srv.Serve(ctx, lis) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	mod := t.TempDir()
	if err := python.WriteTo(mod); err != nil {
		t.Fatal(err)
	}
	return st, func(args ...string) (string, string) {
		t.Helper()
		cmd := exec.Command(py, append([]string{"-c", script}, args...)...)
		cmd.Dir = mod
		cmd.Env = append(os.Environ(), "PYTHONPATH="+mod, "GOTRAIN_AGENT="+filepath.Join(filepath.Dir(sock), "agent.sock"),
			"GOTRAIN_JOB_TOKEN="+testToken, "GOTRAIN_RANK=0", "PYTHONDONTWRITEBYTECODE=1")
		var stderr strings.Builder
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("python %v: %v\n%s%s", args, err, out, stderr.String())
		}
		return strings.TrimSpace(string(out)), stderr.String()
	}
}

const roundTrip = `
import sys, math, torch, gotrain
mode = sys.argv[1]
torch.manual_seed(0)
def build():
    m = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.BatchNorm1d(32), torch.nn.Linear(32, 4))
    return m, torch.optim.Adam(m.parameters(), lr=0.01)
model, opt = build()
for _ in range(3):
    model(torch.randn(8, 64)).sum().backward(); opt.step()
extra = {"epoch": 3, "lr": 0.5, "nan": float("nan"), "name": "run", "blob": b"\x00\x01", "pair": (1, [2.5, None]),
         "ints": {1: "a", 2: "b"}, "half": torch.arange(6, dtype=torch.float16).reshape(2, 3)[:, 1:], "flag": torch.tensor(True)}
if mode == "save":
    p = gotrain.snapshot({"model": model, "opt": opt, "extra": extra}, 7)
    assert p and p.wait()
    print("saved")
else:
    assert gotrain.source() is None
    fresh, fopt = build()
    ident = [id(t) for t in fresh.parameters()]
    state, step, src = gotrain.restore_into({"model": fresh, "opt": fopt, "extra": None}, with_source=True)
    same = all(torch.equal(a, b) for a, b in zip(fresh.state_dict().values(), model.state_dict().values()))
    kept = ident == [id(t) for t in fresh.parameters()]
    o1, o2 = opt.state_dict()["state"], fopt.state_dict()["state"]
    same_opt = sorted(o1) == sorted(o2) and all(torch.equal(o1[k][n], o2[k][n]) for k in o1 for n in o1[k])
    e = state["extra"]
    plain = (e["epoch"], e["lr"], math.isnan(e["nan"]), e["name"], e["blob"], e["pair"], e["ints"]) == (3, 0.5, True, "run", b"\x00\x01", (1, [2.5, None]), {1: "a", 2: "b"})
    tens = torch.equal(e["half"], extra["half"]) and e["half"].dtype == torch.float16 and bool(e["flag"])
    again, step2 = gotrain.restore()
    same_plain = torch.equal(again["model"]["0.weight"], model[0].weight.detach())
    print("restored", step, src, same, kept, same_opt, plain, tens, same_plain, step2)
`

// A model, an Adam optimizer and plain values in one process, which
// exits; a new process restores them into fresh objects bit for bit, the
// module's parameters keeping their identity, the optimizer's state made
// anew, the plain values (a NaN, bytes, a tuple, int keys) as they were.
func TestSnapshotRestoreIntoWithTorch(t *testing.T) {
	t.Setenv("GOTRAIN_SNAPSHOT_TRACE", "1") // the phases' lines too
	st, run := worker(t, torchPython(t), roundTrip)
	out, stderr := run("save")
	if out != "saved" {
		t.Fatalf("save printed %q", out)
	}
	if !strings.Contains(stderr, "gotrain.snapshot: trace rank 0 handed over") {
		t.Errorf("no trace of the hand-over with GOTRAIN_SNAPSHOT_TRACE=1:\n%s", stderr)
	}
	if l := st.List(); len(l) != 1 || l[0].Step != 7 {
		t.Fatalf("the store holds %+v after the save, want rank 0 at step 7", l)
	}
	out, stderr = run("restore")
	want := "gotrain.snapshot: rank 0 restored the state of step 7 from this node's agent's memory ("
	if n := strings.Count(stderr, want); n != 2 {
		t.Errorf("stderr has %d lines %q, want 2:\n%s", n, want, stderr)
	}
	if got, want := out, "restored 7 agent True True True True True True 7"; got != want {
		t.Fatalf("restore printed %q, want %q", got, want)
	}
}

const outside = `
import sys, torch, gotrain, gotrain_snapshot
assert gotrain.snapshot({"w": torch.ones(2)}, 1) is False
assert gotrain.restore() is None
assert gotrain_snapshot.restore_into({"w": torch.ones(2)}) is None
assert not gotrain.available()
print("ok", gotrain.__version__)
`

// Under plain python (no agent) everything imports, snapshot() is False,
// the restores None, with one note on stderr; the version is the agent's.
func TestOutsideGotrain(t *testing.T) {
	py := torchPython(t)
	mod := t.TempDir()
	if err := python.WriteTo(mod); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(py, "-c", outside)
	cmd.Dir = mod
	cmd.Env = append(os.Environ(), "PYTHONPATH="+mod, "GOTRAIN_AGENT=", "PYTHONDONTWRITEBYTECODE=1")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%v\n%s%s", err, out, stderr.String())
	}
	if got := strings.TrimSpace(string(out)); got != "ok "+python.Version {
		t.Errorf("printed %q, want ok %s", got, python.Version)
	}
	if n := strings.Count(stderr.String(), "not running under gotrain"); n != 1 {
		t.Errorf("%d notes on stderr, want 1:\n%s", n, stderr.String())
	}
}

const planted = `
import os, sys, json, struct, socket, mmap, gotrain.memsnap as gm
kind = sys.argv[1]
gm._connect()
def put(data, step, fmt="gtsnap1", rank=0):
    fd = os.memfd_create("x", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, len(data))
    with mmap.mmap(fd, len(data)) as m:
        m[:] = data
    rep, out = gm._call({"op": "put", "rank": rank, "step": step, "size": len(data), "sum": "agent", "format": fmt, "reuse": True}, fd)
    os.close(fd)
    return rep.get("err", "")
def snap(header, body=b""):
    h = json.dumps(header).encode()
    return struct.pack("<8sQ", b"GTSNAP1\n", len(h)) + h + body
if kind == "pickle":
    # A pickle that would run a command, handed over as Go-format bytes
    # (no format the agent checks): the restore must refuse to read it.
    import pickle
    class Boom:
        def __reduce__(self):
            return (os.system, ("touch " + sys.argv[2],))
    print(put(pickle.dumps(Boom()), 5, fmt="") or "kept")
elif kind == "otherrank":
    print(put(snap({"rank": 1, "step": 5, "generation": 0, "run_id": "", "size": 0, "tensors": [], "tree": None}), 5))
elif kind == "outside":
    print(put(snap({"rank": 0, "step": 5, "generation": 0, "run_id": "", "size": 512, "tensors": [{"dtype": "float32", "shape": [1000], "offset": 256, "nbytes": 4000}], "tree": {"t": 0}}).ljust(512, b" "), 5))
elif kind == "restore":
    try:
        gm.restore()
        print("restored")
    except RuntimeError as e:
        print("refused:", e)
`

// Nothing served is executed: a pickle planted as a rank's snapshot is
// refused by the restore, never unpickled; a snapshot that claims another
// rank, or tensors outside its file, is refused by the agent at hand-over.
func TestPlantedSnapshotsRefused(t *testing.T) {
	_, run := worker(t, torchPython(t), planted)
	marker := filepath.Join(t.TempDir(), "pwned")
	if out, _ := run("pickle", marker); out != "kept" {
		t.Fatalf("planting printed %q", out)
	}
	out, _ := run("restore")
	if !strings.HasPrefix(out, "refused: rank 0 on ") || !strings.Contains(out, "not valid") {
		t.Errorf("the restore of a planted pickle printed %q, want a refusal naming the rank", out)
	}
	if _, err := os.Stat(marker); err == nil {
		t.Fatal("the planted pickle ran a command")
	}
	for _, kind := range []string{"otherrank", "outside"} {
		out, _ := run(kind)
		if out == "" {
			t.Errorf("%s: the agent kept it", kind)
		}
		if want := map[string]string{"otherrank": "says it is of rank 1", "outside": "tensor 0 lies outside the file"}[kind]; !strings.Contains(out, want) {
			t.Errorf("%s: the agent said %q, want %q", kind, out, want)
		}
	}
}

const dcpScript = `
import sys, torch, gotrain
import torch.distributed.checkpoint as dcp
from gotrain import dcp as gdcp
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
    dcp.save(state(model, saved_mom, 3), storage_writer=gdcp.writer(9))
    print("saved")
else:
    fresh = torch.nn.Linear(64, 32)
    st = state(fresh, {n: torch.zeros_like(t) for n, t in saved_mom.items()}, 0)
    r = gdcp.reader()
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
	var why []string
	for _, py := range []string{os.Getenv("GOTRAIN_TEST_PYTHON"), "/opt/torch/.venv/bin/python3", "/usr/bin/python3"} {
		if py == "" {
			continue
		}
		out, err := exec.Command(py, "-c", "import torch, torch.distributed.checkpoint").CombinedOutput()
		if err == nil {
			return py
		}
		lines := strings.Split(strings.TrimSpace(string(out)), "\n")
		why = append(why, py+": "+lines[len(lines)-1])
	}
	t.Skipf("no python here has torch.distributed.checkpoint (torch 2.x; Debian 12's torch 1.13 has none), so the DCP storage is tested where one has it, e.g. the GPU machine's torch 2.11 (GOTRAIN_TEST_PYTHON=...): %s", strings.Join(why, "; "))
	return ""
}

// torch.distributed.checkpoint over the tier: dcp.save with the writer in
// one process, which exits; dcp.load with the reader in a new one restores
// the model, the momentum and a non-tensor value bit for bit.
func TestDCPWriterAndReader(t *testing.T) {
	st, run := worker(t, dcpPython(t), dcpScript)
	if got, _ := run("save"); got != "saved" {
		t.Fatalf("save printed %q", got)
	}
	if l := st.List(); len(l) != 1 || l[0].Step != 9 {
		t.Fatalf("the store holds %+v after dcp.save, want rank 0 at step 9", l)
	}
	out, _ := run("restore")
	if got, want := out, "restored 9 agent True True 3"; got != want {
		t.Fatalf("restore printed %q, want %q", got, want)
	}
}

// The CPU tier benchmark (bench/torch_snapshot.py) against a real store: a
// 64 MiB CPU state_dict snapshotted and restored into existing tensors and
// as new ones, bit for bit. Its figures (the tier against clone() of the
// same tensors) go to the log; timing is the benchmark's to judge, not a
// test's, on a shared machine.
func TestSnapshotTierBenchmarkCPU(t *testing.T) {
	script, err := os.ReadFile(filepath.Join("..", "bench", "torch_snapshot.py"))
	if err != nil {
		t.Fatal(err)
	}
	_, run := worker(t, torchPython(t), string(script))
	out, _ := run("--device", "cpu", "--layers", "0", "--mib", "64", "--repeat", "2")
	if !strings.Contains(out, "identical True") {
		t.Fatalf("the restores are not identical:\n%s", out)
	}
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, "result ") {
			t.Log(l)
		}
	}
}

const refused = `
import torch, gotrain
big = {"w": torch.zeros(1 << 20)}  # 4 MiB: more than the agent keeps
small = {"w": torch.ones(16)}
got = []
for state, step in ((big, 1), (small, 2), (small, 3)):
    try:
        gotrain.snapshot(state, step)
        got.append("ok")
    except RuntimeError as e:
        got.append("refused" if "did not keep the snapshot of step 1" in str(e) and "rank 0 on " in str(e) else repr(e))
print(" ".join(got), gotrain.restore()[1])
`

// A snapshot the agent does not keep (over --snapshot-memory) is an error
// that names the rank and the step, raised once (CPU snapshots hand over
// before snapshot() returns), and later snapshots are kept.
func TestRefusedSnapshotRaisesOnce(t *testing.T) {
	_, run := workerLimited(t, torchPython(t), refused, 1<<20)
	if got, want := mustRun(run), "refused ok ok 3"; got != want {
		t.Fatalf("printed %q, want %q", got, want)
	}
}

func mustRun(run func(args ...string) (string, string)) string {
	out, _ := run()
	return out
}
