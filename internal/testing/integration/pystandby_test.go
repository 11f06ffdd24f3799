package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// Python hot standbys (internal/launcher/pystandby) with real torch (gloo, CPU):
// testdata/standby_prog.py, unchanged, crashes once on one rank; the
// restarted ranks must be the warm interpreters the agent logged ready
// (same pid, torch imported before the program's first line), and see
// what a fresh `python3 SCRIPT` would.

var runLine = regexp.MustCompile(`(?m)^\[rank (\d+)\] run rank=\d+ restart=(\d+) pid=(\d+) warm=(\w+) name=(\S+) file=(\S+) argv=(\[.*?\]) path0=(\S+) cwd=(\S+) sigs=(\S+) out=(\S+) keys=(\S+)$`)

// pyRun is one run line of standby_prog.py: sigs are the handlers of
// SIGINT, SIGTERM, SIGPIPE, SIGCHLD and SIGUSR1, out the buffering of
// stdout and stderr, keys the environment's names.
type pyRun struct{ rank, restart, pid, warm, name, file, argv, path0, cwd, sigs, out, keys string }

func pyRuns(stdout string) []pyRun {
	var out []pyRun
	for _, m := range runLine.FindAllStringSubmatch(stdout, -1) {
		out = append(out, pyRun{m[1], m[2], m[3], m[4], m[5], m[6], m[7], m[8], m[9], m[10], m[11], m[12]})
	}
	return out
}

// startTorchJob starts gotrain with args in dir under a python3 with torch.
func startTorchJob(t *testing.T, dir string, args ...string) *job {
	t.Helper()
	path := needTorch(t)
	j := &job{cmd: gotrainCmd(context.Background(), t, []string{path}, args...), done: make(chan struct{})}
	j.cmd.Dir = dir
	j.cmd.Stdout, j.cmd.Stderr = &j.out, &j.err
	if err := j.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = j.cmd.Wait(); close(j.done) }()
	t.Cleanup(func() { _ = j.cmd.Process.Kill(); <-j.done })
	return j
}

// waitStderr waits until ok(stderr) and returns what it returned.
func (j *job) waitStderr(t *testing.T, what string, ok func(string) bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Minute)
	for !ok(j.err.String()) {
		select {
		case <-j.done:
			t.Fatalf("the job ended before %s\nstdout:\n%s\nstderr:\n%s", what, j.out.String(), j.err.String())
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %s within 5m\nstdout:\n%s\nstderr:\n%s", what, j.out.String(), j.err.String())
		}
	}
}

// crashOnceWithStandbys runs standby_prog with nproc ranks (rank crash
// crashes once the standbys of every slot are ready) and returns the job,
// once ended, and the standbys' pids by slot as they were at the crash.
func crashOnceWithStandbys(t *testing.T, dir string, nproc, crash int, prog []string, final string) (*job, map[string]string) {
	t.Helper()
	goFile := filepath.Join(t.TempDir(), "go")
	args := append([]string{"launch", "--verbose", "--nproc-per-node", fmt.Sprint(nproc), "--backend", "cpu", "--max-restarts", "1", "--standby=auto", "--"}, prog...)
	j := startTorchJob(t, dir, append(args, goFile, fmt.Sprint(crash), final)...)
	var ready map[string]string
	j.waitStderr(t, "every standby ready", func(s string) bool { ready = readyStandbys(s); return len(ready) == nproc })
	if err := os.WriteFile(goFile, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	j.wait(t, 5*time.Minute)
	return j, ready
}

// checkWarmRestart checks that every rank of the restarted generation was
// its slot's standby (ready lists them by slot) and saw what its first run
// saw, but for the rank's own pid.
func checkWarmRestart(t *testing.T, j *job, ready map[string]string, wantFile, wantArgv0, wantPath0, wantCwd string) {
	t.Helper()
	runs := pyRuns(j.out.String())
	first := map[string]pyRun{}
	n := 0
	for _, r := range runs {
		if r.restart == "0" {
			first[r.rank] = r
			if r.warm != "False" {
				t.Errorf("rank %s's first run: warm=%s, want False (a fresh interpreter)", r.rank, r.warm)
			}
			continue
		}
		n++
		if r.warm != "True" || r.pid != ready[r.rank] {
			t.Errorf("restarted rank %s: pid %s warm=%s, want the ready standby of slot %s (pid %s) with torch imported", r.rank, r.pid, r.warm, r.rank, ready[r.rank])
		}
		if r.name != "__main__" || r.file != wantFile || !strings.HasPrefix(r.argv, "['"+wantArgv0+"', ") || r.path0 != wantPath0 || r.cwd != wantCwd {
			t.Errorf("restarted rank %s saw name=%s file=%s argv=%s path0=%s cwd=%s; want __main__, %s, [%q, ...], %s, %s", r.rank, r.name, r.file, r.argv, r.path0, r.cwd, wantFile, wantArgv0, wantPath0, wantCwd)
		}
		if f, ok := first[r.rank]; !ok || f.keys != r.keys || f.argv != r.argv || f.file != r.file || f.path0 != r.path0 || f.sigs != r.sigs || f.out != r.out {
			t.Errorf("restarted rank %s differs from its fresh run:\nfresh:   %+v\nstandby: %+v", r.rank, f, r)
		}
	}
	if n != len(ready) {
		t.Errorf("%d restarted ranks, want %d\nstdout:\n%s\nstderr:\n%s", n, len(ready), j.out.String(), j.err.String())
	}
	for rank := range ready {
		if want := fmt.Sprintf("[rank %s] allreduce rank=%s restart=1 sum=%d", rank, rank, len(ready)*(len(ready)+1)/2); !strings.Contains(j.out.String(), want) {
			t.Errorf("no %q: the restarted ranks do not agree\nstdout:\n%s", want, j.out.String())
		}
	}
}

// A script: both ranks of the restart are standbys; DataLoaders with fork
// and spawn workers run under them; rank 0's sys.exit(7) is the job's.
func TestPythonStandbyTakesOverScript(t *testing.T) {
	t.Parallel()
	prog := testdata(t, "standby_prog.py")
	dir := t.TempDir()
	j, ready := crashOnceWithStandbys(t, dir, 2, 1, []string{"python3", prog}, "loaders,exit7")
	if code := j.cmd.ProcessState.ExitCode(); code != 7 {
		t.Errorf("exit %d, want 7 (rank 0's sys.exit(7))\nstdout:\n%s\nstderr:\n%s", code, j.out.String(), j.err.String())
	}
	checkWarmRestart(t, j, ready, prog, prog, filepath.Dir(prog), dir)
	for _, rank := range []string{"0", "1"} {
		if want := "[rank " + rank + "] loaders rank=" + rank + " fork=140 spawn=140"; !strings.Contains(j.out.String(), want) {
			t.Errorf("no %q (DataLoader workers under a standby)\nstdout:\n%s\nstderr:\n%s", want, j.out.String(), j.err.String())
		}
	}
	if strings.Contains(j.err.String(), "warning: --standby is off") {
		t.Errorf("standbys turned off:\n%s", j.err.String())
	}
}

// python3 -m MODULE: the module runs as __main__ from the working
// directory; an uncaught exception is exit 1 with the program's traceback,
// as from a fresh interpreter.
func TestPythonStandbyTakesOverModule(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	src, err := os.ReadFile(testdata(t, "standby_prog.py"))
	if err != nil {
		t.Fatal(err)
	}
	mod := filepath.Join(dir, "standby_prog.py")
	if err := os.WriteFile(mod, src, 0o644); err != nil {
		t.Fatal(err)
	}
	j, ready := crashOnceWithStandbys(t, dir, 1, 0, []string{"python3", "-u", "-m", "standby_prog"}, "raise")
	if code := j.cmd.ProcessState.ExitCode(); code != 1 {
		t.Errorf("exit %d, want 1 (an uncaught exception)\nstdout:\n%s\nstderr:\n%s", code, j.out.String(), j.err.String())
	}
	checkWarmRestart(t, j, ready, mod, mod, dir, dir)
	stderr := j.err.String()
	if !strings.Contains(stderr, "[rank 0] Traceback (most recent call last):") || !strings.Contains(stderr, "[rank 0] ValueError: boom from the program") {
		t.Errorf("no traceback of the ValueError from rank 0\nstderr:\n%s", stderr)
	}
	if strings.Contains(stderr, `File "<string>"`) {
		t.Errorf("the traceback shows the bootstrap's frames\nstderr:\n%s", stderr)
	}
}

// A standby that cannot be warmed (a --standby-preload module that does
// not exist): one warning saying why, and the restart starts a fresh
// interpreter that runs the job to the end.
func TestPythonStandbyFallsBackToColdStart(t *testing.T) {
	t.Parallel()
	goFile := filepath.Join(t.TempDir(), "go")
	j := startTorchJob(t, t.TempDir(), "launch", "--nproc-per-node", "1", "--backend", "cpu", "--max-restarts", "1",
		"--standby-preload", "no_such_module_for_gotrain", "--", "python3", testdata(t, "standby_prog.py"), goFile, "0", "")
	j.waitStderr(t, "the warning", func(s string) bool { return strings.Contains(s, "warning: --standby is off") })
	if err := os.WriteFile(goFile, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if code := j.wait(t, 5*time.Minute); code != 0 {
		t.Fatalf("exit %d, want 0\nstdout:\n%s\nstderr:\n%s", code, j.out.String(), j.err.String())
	}
	stderr := j.err.String()
	if n := strings.Count(stderr, "gotrain: warning"); n != 1 || !strings.Contains(stderr, "no_such_module_for_gotrain") {
		t.Errorf("%d warnings, want one naming the module\nstderr:\n%s", n, stderr)
	}
	var restarted []pyRun
	for _, r := range pyRuns(j.out.String()) {
		if r.restart == "1" {
			restarted = append(restarted, r)
		}
	}
	if len(restarted) != 1 || restarted[0].warm != "False" {
		t.Errorf("restarted runs %+v, want one fresh interpreter\nstdout:\n%s", restarted, j.out.String())
	}
}

// fidelityRun is one FIDELITY line of testdata/standby_fidelity.py.
type fidelityRun map[string]any

func fidelityRuns(t *testing.T, stdout string) map[string]fidelityRun {
	t.Helper()
	out := map[string]fidelityRun{}
	for _, l := range strings.Split(stdout, "\n") {
		_, js, ok := strings.Cut(l, "] FIDELITY ")
		if !ok {
			continue
		}
		var r fidelityRun
		if err := json.Unmarshal([]byte(js), &r); err != nil {
			t.Fatalf("%v: %s", err, l)
		}
		out[fmt.Sprintf("%v/%v", r["rank"], r["restart"])] = r
	}
	return out
}

// perRun are the environment variables that differ between a rank's runs
// whoever starts it: the restart count, the generation, its error file and
// the supervisor's tag of the process.
var perRun = map[string]bool{"TORCHELASTIC_RESTART_COUNT": true, "GOTRAIN_GENERATION": true, "GOTRAIN_RESTART_COUNT": true,
	"TORCHELASTIC_ERROR_FILE": true, "GOTRAIN_SUPERVISE_TAG": true}

// A rank a standby runs is a fresh rank, field by field: the environment
// (with what the program set before importing torch in effect: torch's
// thread count), argv, sys.orig_argv, /proc/PID/cmdline (ps), open
// descriptors, cwd, every signal handler, co_filename, __main__'s globals
// and __annotations__; the one difference meant is that its rendezvous
// waits for rank 0's TCPStore to listen (torch.distributed.rendezvous's
// _create_c10d_store wrapped, __wrapped__ the original). With a variable torch reads at import set by the
// program, the standby starts the rank over in a fresh interpreter and says
// why.
func TestPythonStandbyRankIsAFreshRank(t *testing.T) {
	t.Parallel()
	prog := testdata(t, "standby_fidelity.py")
	for _, mode := range []string{"warm", "cold"} {
		t.Run(mode, func(t *testing.T) {
			dir := t.TempDir()
			j, ready := crashOnceWithStandbys(t, dir, 2, 1, []string{"python3", prog}, mode)
			if code := j.cmd.ProcessState.ExitCode(); code != 0 {
				t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, j.out.String(), j.err.String())
			}
			runs := fidelityRuns(t, j.out.String())
			for _, rank := range []string{"0", "1"} {
				fresh, again := runs[rank+"/0"], runs[rank+"/1"]
				if fresh == nil || again == nil {
					t.Fatalf("rank %s: runs %v\nstdout:\n%s\nstderr:\n%s", rank, runs, j.out.String(), j.err.String())
				}
				if fresh["warm"] != false {
					t.Errorf("rank %s's first run was warm", rank)
				}
				wantWarm := mode == "warm"
				if again["warm"] != wantWarm || fmt.Sprint(again["pid"]) != ready[rank] {
					t.Errorf("rank %s restarted: warm=%v pid %v; want warm=%v in slot %s's standby (pid %s)", rank, again["warm"], again["pid"], wantWarm, rank, ready[rank])
				}
				if fresh["threads"] != float64(3) {
					t.Errorf("rank %s fresh: %v threads, want 3 (OMP_NUM_THREADS=3 set before import torch)", rank, fresh["threads"])
				}
				for k, fv := range fresh {
					switch k {
					case "pid", "restart", "warm":
						continue
					case "store_wait": // the one difference meant (internal/launcher/pystandby/pystandby.py)
						if fv != false || again[k] != wantWarm {
							t.Errorf("rank %s: store_wait fresh %v, restarted %v; want false, %v", rank, fv, again[k], wantWarm)
						}
						continue
					case "env":
						fe, ae := fv.(map[string]any), again["env"].(map[string]any)
						for name := range fe {
							if _, ok := ae[name]; !ok {
								t.Errorf("rank %s restarted: no %s (fresh: %v)", rank, name, fe[name])
							}
						}
						for name, v := range ae {
							if !perRun[name] && fmt.Sprint(fe[name]) != fmt.Sprint(v) {
								t.Errorf("rank %s restarted: %s=%v, fresh %v", rank, name, v, fe[name])
							}
						}
						continue
					}
					if fmt.Sprint(fv) != fmt.Sprint(again[k]) {
						t.Errorf("rank %s restarted: %s\n got %v\nfresh %v", rank, k, again[k], fv)
					}
				}
				if fa := fmt.Sprint(fresh["co_filename"]); fa != prog {
					t.Errorf("rank %s fresh co_filename %s, want %s", rank, fa, prog)
				}
			}
			said := strings.Count(j.err.String(), "before importing torch, which this warm standby imported with TORCH_SHOW_CPP_STACKTRACES=(unset)")
			if mode == "cold" && said != 2 || mode == "warm" && said != 0 {
				t.Errorf("%d lines saying why a rank starts over, want %d\nstderr:\n%s", said, map[bool]int{true: 2}[mode == "cold"], j.err.String())
			}
		})
	}
}
