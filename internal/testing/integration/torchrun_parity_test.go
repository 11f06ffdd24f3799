package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gotrain/gotrain/internal/testing/testkit"
)

// The torchrun parity suite: each case runs the same command line under
// PyTorch's own torchrun and under `gotrain torchrun`, each in a fresh
// directory, and compares the launcher's exit status, the files the ranks
// wrote and what each rank saw (its environment as the launcher set it, its
// argv, interpreter, working directory and sys.path[0]).
//
// Accepted differences, normalised before comparing:
//   - the run's directory (each launcher has its own): "<dir>";
//   - MASTER_ADDR 127.0.0.1 or localhost: both loopback (torchrun's
//     --standalone says localhost, gotrain 127.0.0.1);
//   - a MASTER_PORT either launcher picked: any port, the same for every rank
//     (a --master_port given is honoured by both);
//   - TORCH_NCCL_ASYNC_ERROR_HANDLING=1: torchrun sets it from PyTorch 2.0
//     on, gotrain for every version; NCCL_ASYNC_ERROR_HANDLING=1: torchrun
//     before 2.2 sets it, gotrain's torch hook in the process for such a
//     torch (when it calls init_process_group);
//   - TORCHELASTIC_RUN_ID: "none", a UUID or gotrain's run id, each chosen
//     per run; only that it is set is compared;
//   - TORCHELASTIC_ERROR_FILE: a path of the launcher's own;
//   - what gotrain adds for itself: GOTRAIN_* (its worker protocol), its
//     agent's module dir last on PYTHONPATH (docs/pytorch.md, "the agent puts the
//     module on the workers' PYTHONPATH"), NCCL_NVLS_ENABLE=0 and the flight
//     recorder's TORCH_FR_BUFFER_SIZE and TORCH_NCCL_DUMP_ON_TIMEOUT (which
//     gotrain diagnose reads);
//   - the interpreter path, compared after symlinks (python3 → python3.11);
//   - whether torch was imported before the script ran (a gotrain Python
//     standby's doing, logged only).
//
// torchrun alone gets --redirects=1 --tee=1 (Debian's torch 1.13 under
// Python 3.11 fails on its own defaults; gotrain honours --redirects, so
// they cannot be common) and --monitor_interval=1 (its default, 5 s, only
// delays its exit); and, where its argparse lacks them (torch < 2.1), the
// underscore spelling of dashed flags.

// parityGaps are the differences known today, keyed as compare keys them:
// the suite logs them as gaps instead of failing.
var parityGaps = map[string]string{
	"env:TORCHELASTIC_USE_AGENT_STORE": "torchrun says True on a static line (its agent hosts the TCPStore and ranks connect to it); gotrain always False (rank 0 hosts the store at MASTER_PORT, as torchrun's c10d and --standalone lines)",
}

// parityProgram records what the rank sees into OUT/rankR-restartN.json and
// then does what its "+" arguments say: +allreduce (gloo, the sum of
// rank+1), +fail=RANK:CODE (that rank exits CODE once the others have
// written), +fail-once=RANK:CODE:MARKER:SECONDS (the same, SECONDS later,
// while MARKER is absent).
const parityProgram = `import json, os, sys, time
preloaded = "torch" in sys.modules  # a gotrain standby imported it already
out = sys.argv[1]
rank, restart = os.environ["RANK"], os.environ["TORCHELASTIC_RESTART_COUNT"]
opts = [a[1:].partition("=")[::2] for a in sys.argv[2:] if a.startswith("+")]
rec = {"argv": sys.argv, "orig_argv": sys.orig_argv[1:], "executable": sys.executable,
       "cwd": os.getcwd(), "path0": sys.path[0], "env": dict(os.environ), "preloaded": preloaded}
for name, val in opts:
    if name == "allreduce":
        import torch, torch.distributed as dist
        dist.init_process_group("gloo")
        t = torch.tensor([float(dist.get_rank() + 1)])
        dist.all_reduce(t)
        rec["sum"] = t.item()
        dist.destroy_process_group()
os.makedirs(out, exist_ok=True)
name = os.path.join(out, "rank%s-restart%s.json" % (rank, restart))
with open(name + ".tmp", "w") as f:
    json.dump(rec, f)
os.rename(name + ".tmp", name)
def others_wrote():
    # The failing rank exits once every rank of this attempt has written its
    # file: either launcher stops the others when one fails.
    want = ["rank%d-restart%s.json" % (r, restart) for r in range(int(os.environ["WORLD_SIZE"]))]
    deadline = time.time() + 120
    while not all(os.path.exists(os.path.join(out, w)) for w in want) and time.time() < deadline:
        time.sleep(0.05)
for name, val in opts:
    if name == "fail":
        r, code = val.split(":")
        if r == rank:
            others_wrote()
            sys.exit(int(code))
    if name == "fail-once":
        r, code, marker, delay = val.split(":")
        if r == rank and not os.path.exists(marker):
            others_wrote()
            time.sleep(float(delay))
            open(marker, "w").close()
            sys.exit(int(code))
`

// paritySh is a program that is no Python script, for --no_python.
const paritySh = "#!/bin/sh\nexec python3 \"$(dirname \"$0\")/parity.py\" \"$@\"\n"

type parityCase struct {
	name string
	args []string // the line after the launcher's name; {port} is a free port
	env  []string // set for both launchers
	// torchrunExit is what torchrun must exit with (checks the case);
	// gotrainExit, with exitGap saying why, what gotrain exits with where it
	// differs.
	torchrunExit, gotrainExit int
	exitGap                   string
	gaps                      map[string]string // known gaps of this case alone, as parityGaps
}

var parityCases = []parityCase{
	{name: "nproc-per-node", args: []string{"--nproc-per-node=2", "--master-port={port}", "parity.py", "out"}},
	{name: "one-rank", args: []string{"--master_port={port}", "parity.py", "out"}},
	{name: "standalone-allreduce", args: []string{"--nproc_per_node", "2", "--standalone", "parity.py", "out", "+allreduce"}},
	{name: "module", args: []string{"--nproc_per_node=2", "--master_port={port}", "-m", "parity_mod", "out"}, env: []string{"PYTHONPATH=mods"}},
	{name: "no-python", args: []string{"--nproc_per_node=2", "--master_port={port}", "--no_python", "./parity.sh", "out"}},
	{name: "nproc-abbreviated", args: []string{"--nproc=2", "--master_port={port}", "parity.py", "out"}},
	{name: "local-rank-macro", args: []string{"--nproc_per_node=2", "--master_port={port}", "parity.py", "out", "--local-rank=${local_rank}", "$local_rank.log", "${local_rank}"}},
	{name: "omp-num-threads-set", args: []string{"--nproc_per_node=2", "--master_port={port}", "parity.py", "out"}, env: []string{"OMP_NUM_THREADS=3"}},
	{name: "role", args: []string{"--nproc_per_node=2", "--master_port={port}", "--role", "trainer", "parity.py", "out"}},
	{name: "failing-rank", args: []string{"--nproc_per_node=2", "--master_port={port}", "--max_restarts=0", "parity.py", "out", "+fail=1:3"},
		torchrunExit: 1, gotrainExit: 3, exitGap: "torchrun exits 1 when a worker fails (ChildFailedError); gotrain exits with the failing rank's status"},
	{name: "restarts-exhausted", args: []string{"--nproc_per_node=2", "--master_port={port}", "--max_restarts=1", "parity.py", "out", "+fail=1:3"},
		torchrunExit: 1, gotrainExit: 3, exitGap: "torchrun exits 1 when a worker fails (ChildFailedError); gotrain exits with the failing rank's status"},
	// Rank 1 fails once, late enough for gotrain's Python standbys (started
	// 2 s after the ranks) to be warm: the second attempt's ranks usually
	// run in them, the macro substituted in their assignment.
	{name: "restart-once", args: []string{"--nproc_per_node=2", "--master_port={port}", "--max_restarts=1", "parity.py", "out", "+fail-once=1:3:marker:5", "${local_rank}"}},
}

func TestTorchrunParity(t *testing.T) {
	t.Parallel()
	path := needTorch(t)
	py := filepath.Join(torchPy.dir, "python3")
	// PyTorch's torchrun: the one beside that python3, else its module
	// (gotrain picks the same interpreter either way: docs/pytorch.md, "The
	// interpreter").
	torchrun := []string{py, "-m", "torch.distributed.run"}
	if p := filepath.Join(filepath.Dir(py), "torchrun"); isFile(p) {
		torchrun = []string{p}
	}
	var mu sync.Mutex
	seen := map[string][]string{} // gap -> the cases that showed it
	t.Run("cases", func(t *testing.T) {
		for _, c := range parityCases {
			t.Run(c.name, func(t *testing.T) {
				t.Parallel()
				port := freePort(t)
				theirArgs := append(append([]string{}, torchrun[1:]...), "--redirects=1", "--tee=1", "--monitor_interval=1")
				theirArgs = append(theirArgs, torchrunSpelling(t, torchrun, expandPort(c.args, port))...)
				theirProg := torchrun[0]
				if slices.Contains(c.args, "--standalone") {
					theirProg, theirArgs = privateNet(theirProg, theirArgs)
				}
				theirs := runParity(t, path, c, theirProg, theirArgs)
				ours := runParity(t, path, c, bin.gotrain, append([]string{"torchrun"}, expandPort(c.args, port)...))
				found := compareParity(t, c, port, theirs, ours)
				mu.Lock()
				for _, g := range found {
					seen[g] = append(seen[g], c.name)
				}
				mu.Unlock()
			})
		}
	})
	var lines []string
	for _, g := range slices.Sorted(maps.Keys(seen)) {
		slices.Sort(seen[g])
		lines = append(lines, fmt.Sprintf("%s\n    in %s", g, strings.Join(seen[g], ", ")))
	}
	if len(lines) > 0 {
		t.Logf("known parity gaps seen:\n  %s", strings.Join(lines, "\n  "))
	}
}

func isFile(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.Mode().IsRegular()
}

func expandPort(args []string, port int) []string {
	out := make([]string, len(args))
	for i, a := range args {
		out[i] = strings.ReplaceAll(a, "{port}", strconv.Itoa(port))
	}
	return out
}

var torchrunHelp struct {
	once sync.Once
	text string
}

// torchrunSpelling gives torchrun the underscore spelling of the dashed
// flags before the script when its --help has no dashed ones (torch < 2.1).
func torchrunSpelling(t *testing.T, torchrun, args []string) []string {
	lead := 0 // the leading --flag=value arguments (the cases give dashed flags so)
	for lead < len(args) && strings.HasPrefix(args[lead], "--") {
		lead++
	}
	if !slices.ContainsFunc(args[:lead], func(a string) bool { name, _, _ := strings.Cut(a[2:], "="); return strings.Contains(name, "-") }) {
		return args
	}
	torchrunHelp.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		out, _ := exec.CommandContext(ctx, torchrun[0], append(torchrun[1:], "--help")...).CombinedOutput()
		torchrunHelp.text = string(out)
	})
	if strings.Contains(torchrunHelp.text, "--nproc-per-node") {
		return args
	}
	out := slices.Clone(args)
	for i, a := range out[:lead] {
		name, val, hasVal := strings.Cut(a[2:], "=")
		out[i] = "--" + strings.ReplaceAll(name, "-", "_")
		if hasVal {
			out[i] += "=" + val
		}
	}
	t.Logf("this torchrun predates dashed flags: it gets %q", out)
	return out
}

// parityRun is one launcher's run of a case.
type parityRun struct {
	dir            string
	code           int
	stdout, stderr string
	parent         map[string]string         // the launcher's environment
	files          []string                  // under out/
	recs           map[string]map[string]any // by file
}

// parityEnvDrop are variables of this process that must not reach the
// launchers: they would steer one of them, or hide what it sets.
func parityEnvDrop(kv string) bool {
	k, _, _ := strings.Cut(kv, "=")
	for _, p := range []string{"PET_", "TORCHELASTIC_", "GOTRAIN_", "SLURM_", "GROUP_", "ROLE_", "LOCAL_", "MASTER_", "KUBERNETES_"} {
		if strings.HasPrefix(k, p) {
			return true
		}
	}
	switch k {
	case "RANK", "WORLD_SIZE", "OMP_NUM_THREADS", "PYTHONPATH", "PYTHON_EXEC", "PATH", "NCCL_ASYNC_ERROR_HANDLING", "TORCH_NCCL_ASYNC_ERROR_HANDLING", "CUDA_VISIBLE_DEVICES":
		return true
	}
	return false
}

// privateNet runs program in a network namespace of its own (loopback
// only) where this machine allows it: torch 1.13's torchrun --standalone
// always takes port 29400, which gotrain's default coordinator port in the
// tests running beside it (or another run's torchrun) may hold.
func privateNet(program string, args []string) (string, []string) {
	if _, err := exec.LookPath("unshare"); err != nil || os.Geteuid() != 0 {
		return program, args
	}
	// sh sets PWD: give the program the variable as this process has it.
	pwd, script := "", `ip link set lo up && unset PWD && exec "$@"`
	if v, ok := os.LookupEnv("PWD"); ok {
		pwd, script = v, `ip link set lo up && export PWD="$0" && exec "$@"`
	}
	return "unshare", append([]string{"--net", "sh", "-c", script, pwd, program}, args...)
}

// runParity runs program args for case c in a fresh directory holding the
// case's programs, and reads what the ranks wrote.
func runParity(t *testing.T, path string, c parityCase, program string, args []string) parityRun {
	t.Helper()
	dir, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	for name, text := range map[string]string{"parity.py": parityProgram, "mods/parity_mod.py": parityProgram, "parity.sh": paritySh} {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(text), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	env := slices.DeleteFunc(os.Environ(), parityEnvDrop)
	env = append(env, testTag(t), path)
	env = append(env, c.env...)
	r := parityRun{dir: dir, parent: map[string]string{}, recs: map[string]map[string]any{}}
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		r.parent[k] = v
	}
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, program, args...)
	cmd.Env, cmd.Dir = env, dir
	var out, errb testkit.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err = cmd.Run()
	r.stdout, r.stderr = out.String(), errb.String()
	if ee, ok := err.(*exec.ExitError); ok {
		r.code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("%s %v: %v", program, args, err)
	}
	if ctx.Err() != nil {
		t.Fatalf("%s %v did not finish within 3 minutes\nstdout:\n%s\nstderr:\n%s", program, args, r.stdout, r.stderr)
	}
	ents, _ := os.ReadDir(filepath.Join(dir, "out"))
	for _, e := range ents {
		r.files = append(r.files, e.Name())
		b, err := os.ReadFile(filepath.Join(dir, "out", e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		var m map[string]any
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatalf("%s: %v", e.Name(), err)
		}
		r.recs[e.Name()] = m
	}
	return r
}

// parityView is what one rank saw, normalised (see the top of the file):
// "argv", "orig_argv", "executable", "cwd", "path0", "sum" and "env:NAME"
// for each variable the launcher set, changed or removed.
func parityView(r parityRun, rec map[string]any, port int) map[string]string {
	norm := func(s string) string { return strings.ReplaceAll(s, r.dir, "<dir>") }
	v := map[string]string{}
	for _, k := range []string{"argv", "orig_argv"} {
		var l []string
		for _, a := range rec[k].([]any) {
			l = append(l, norm(a.(string)))
		}
		v[k] = fmt.Sprintf("%q", l)
	}
	exe := rec["executable"].(string)
	if p, err := filepath.EvalSymlinks(exe); err == nil {
		exe = p
	}
	v["executable"], v["cwd"], v["path0"] = exe, norm(rec["cwd"].(string)), norm(rec["path0"].(string))
	if s, ok := rec["sum"]; ok {
		v["sum"] = fmt.Sprint(s)
	}
	env := map[string]string{}
	for k, x := range rec["env"].(map[string]any) {
		env[k] = x.(string)
	}
	keys := map[string]bool{}
	for k := range env {
		keys[k] = true
	}
	for k := range r.parent {
		keys[k] = true
	}
	for k := range keys {
		val, set := env[k]
		if k == "PYTHONPATH" && set { // gotrain's agent module, last
			val = strings.Join(slices.DeleteFunc(strings.Split(val, string(os.PathListSeparator)), func(e string) bool {
				return strings.Contains(e, "gotrain-agent-")
			}), string(os.PathListSeparator))
			_, inParent := r.parent[k]
			set = val != "" || inParent
		}
		if p, inParent := r.parent[k]; inParent == set && p == val {
			continue // not the launcher's doing
		}
		if !set {
			val = "<unset>"
		}
		switch {
		case strings.HasPrefix(k, "GOTRAIN_"), k == "NCCL_NVLS_ENABLE", k == "TORCH_FR_BUFFER_SIZE", k == "TORCH_NCCL_DUMP_ON_TIMEOUT":
			continue
		case k == "TORCH_NCCL_ASYNC_ERROR_HANDLING" && val == "1":
			continue // torchrun sets it from PyTorch 2.0 on, 1.13 does not; gotrain always
		case k == "NCCL_ASYNC_ERROR_HANDLING" && val == "1":
			continue // torchrun before 2.2 sets the older name; gotrain's torch hook sets it in process for such a torch
		case k == "TORCHELASTIC_RUN_ID" && set && val != "":
			val = "<run id>"
		case k == "TORCHELASTIC_ERROR_FILE" && filepath.IsAbs(val):
			val = "<file>"
		case k == "MASTER_ADDR" && (val == "127.0.0.1" || val == "localhost"):
			val = "<loopback>"
		case k == "MASTER_PORT" && val == strconv.Itoa(port):
			val = "<the --master_port given>"
		case k == "MASTER_PORT":
			if _, err := strconv.Atoi(val); err == nil {
				val = "<a port of its own>"
			}
		}
		v["env:"+k] = norm(val)
	}
	return v
}

// compareParity fails t for each difference that is no known gap and
// returns the known gaps it saw.
func compareParity(t *testing.T, c parityCase, port int, theirs, ours parityRun) []string {
	t.Helper()
	var found []string
	gap := func(what, why string) { found = append(found, what+": "+why) }
	dump := func() string {
		return fmt.Sprintf("torchrun stderr:\n%s\ngotrain stderr:\n%s", theirs.stderr, ours.stderr)
	}
	if theirs.code != c.torchrunExit {
		t.Fatalf("torchrun exited %d, the case expects %d\n%s", theirs.code, c.torchrunExit, dump())
	}
	switch {
	case ours.code == theirs.code:
	case c.exitGap != "" && ours.code == c.gotrainExit:
		gap(fmt.Sprintf("exit status: torchrun %d, gotrain %d", theirs.code, ours.code), c.exitGap)
	default:
		t.Errorf("exit status: torchrun %d, gotrain %d\n%s", theirs.code, ours.code, dump())
	}
	if !slices.Equal(theirs.files, ours.files) {
		t.Fatalf("files written: torchrun %q, gotrain %q\n%s", theirs.files, ours.files, dump())
	}
	if len(theirs.files) == 0 {
		t.Fatalf("no rank wrote anything\n%s", dump())
	}
	seen := map[string]bool{}
	for _, f := range theirs.files {
		tv, ov := parityView(theirs, theirs.recs[f], port), parityView(ours, ours.recs[f], port)
		if ours.recs[f]["preloaded"] == true {
			t.Logf("%s: gotrain ran it in a warm standby", f)
		}
		keys := map[string]bool{}
		for k := range tv {
			keys[k] = true
		}
		for k := range ov {
			keys[k] = true
		}
		for _, k := range slices.Sorted(maps.Keys(keys)) {
			a, aok := tv[k]
			b, bok := ov[k]
			if a == b && aok == bok {
				continue
			}
			if !aok {
				a = "(not set by it)"
			}
			if !bok {
				b = "(not set by it)"
			}
			why, ok := c.gaps[k]
			if !ok {
				why, ok = parityGaps[k]
			}
			if ok {
				if !seen[k] {
					seen[k] = true
					gap(fmt.Sprintf("%s: torchrun %s, gotrain %s", k, a, b), why)
				}
				continue
			}
			t.Errorf("%s %s: torchrun %s, gotrain %s", f, k, a, b)
		}
	}
	// Values normalised away must still agree between an attempt's ranks.
	for _, r := range []parityRun{theirs, ours} {
		for _, k := range []string{"MASTER_PORT", "TORCHELASTIC_RUN_ID"} {
			vals := map[string]map[string]bool{} // by restart count
			for _, rec := range r.recs {
				env := rec["env"].(map[string]any)
				n := fmt.Sprint(env["TORCHELASTIC_RESTART_COUNT"])
				if vals[n] == nil {
					vals[n] = map[string]bool{}
				}
				vals[n][fmt.Sprint(env[k])] = true
			}
			for n, vs := range vals {
				if len(vs) > 1 {
					t.Errorf("%s: the ranks of attempt %s saw different %s: %v", r.dir, n, k, vs)
				}
			}
		}
	}
	if t.Failed() {
		t.Logf("%s", dump())
	}
	return found
}
