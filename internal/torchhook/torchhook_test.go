package torchhook

import (
	"bufio"
	"context"
	"encoding/binary"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gotrain/gotrain/internal/testing/testkit"
)

// install puts the module into a fresh directory and returns it with the
// records' directory.
func install(t *testing.T) (py, out string) {
	t.Helper()
	d := t.TempDir()
	py, out = filepath.Join(d, "python"), filepath.Join(d, "progress")
	if err := Install(py, out); err != nil {
		t.Fatal(err)
	}
	return py, out
}

// python3 is an interpreter that imports torch with gloo, or the test
// skips (fails under CI=true, where .ci/run installs python3-torch).
func python3(t *testing.T) string {
	t.Helper()
	for _, py := range []string{"/usr/bin/python3", "python3"} {
		ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
		err := exec.CommandContext(ctx, py, "-c", "import torch.distributed as d; assert d.is_gloo_available()").Run()
		cancel()
		if err == nil {
			return py
		}
	}
	why := "no python3 imports torch with gloo; install it with: apt-get install --no-install-recommends python3-torch"
	if os.Getenv("CI") == "true" {
		t.Fatal(why)
	}
	t.Skip(why)
	return ""
}

// The machine's own sitecustomize (the next one on the path) still runs,
// and with no records directory the hook does nothing else.
func TestRunsTheSiteCustomizeItShadows(t *testing.T) {
	py, out := install(t)
	theirs := t.TempDir()
	marker := filepath.Join(t.TempDir(), "ran")
	code := "open(" + strconv.Quote(marker) + ", 'w').write(__name__)\n"
	if err := os.WriteFile(filepath.Join(theirs, "sitecustomize.py"), []byte(code), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(t.Context(), "python3", "-c", "import sys; print(sys.modules['sitecustomize'].__file__)")
	cmd.Env = append(os.Environ(), "PYTHONPATH="+py+string(os.PathListSeparator)+theirs)
	got, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("python3 with the hook: %v\n%s", err, got)
	}
	if strings.TrimSpace(string(got)) != filepath.Join(py, "sitecustomize.py") {
		t.Errorf("sitecustomize is %s, want gotrain's", got)
	}
	if b, err := os.ReadFile(marker); err != nil || string(b) != "sitecustomize" {
		t.Errorf("the shadowed sitecustomize did not run as sitecustomize: %q, %v", b, err)
	}
	if es, _ := os.ReadDir(out); len(es) != 0 {
		t.Errorf("records written without %s: %v", EnvDir, es)
	}
}

// rank is one process of the two-rank job.
type rank struct {
	cmd   *exec.Cmd
	lines chan string
}

// startJob runs testdata/gloo_steps.py as two ranks, with the hook when
// out is not "".
func startJob(t *testing.T, py, pyDir, out string, env ...string) [2]*rank {
	t.Helper()
	prog, err := filepath.Abs("testdata/gloo_steps.py")
	if err != nil {
		t.Fatal(err)
	}
	initFile := filepath.Join(t.TempDir(), "init")
	var rs [2]*rank
	for i := range rs {
		cmd := exec.Command(py, prog)
		cmd.Env = append(os.Environ(), "PYTHONPATH="+pyDir, "RANK="+strconv.Itoa(i), "WORLD_SIZE=2", "INIT_FILE="+initFile, "OMP_NUM_THREADS=1")
		if out != "" {
			cmd.Env = append(cmd.Env, EnvDir+"="+out)
		}
		cmd.Env = append(cmd.Env, env...)
		var stderr testkit.Buffer
		cmd.Stderr = &stderr
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		r := &rank{cmd: cmd, lines: make(chan string, 16)}
		go func() {
			sc := bufio.NewScanner(stdout)
			for sc.Scan() {
				r.lines <- sc.Text()
			}
			close(r.lines)
		}()
		t.Cleanup(func() {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			if t.Failed() {
				t.Logf("rank %d's stderr:\n%s", i, stderr.String())
			}
		})
		rs[i] = r
	}
	return rs
}

// line waits for rank r's line starting with prefix.
func (r *rank) line(t *testing.T, prefix string) []string {
	t.Helper()
	deadline := time.After(2 * time.Minute)
	for {
		select {
		case l, ok := <-r.lines:
			if !ok {
				t.Fatalf("the rank ended before printing %s", prefix)
			}
			if f := strings.Fields(l); len(f) > 0 && f[0] == prefix {
				return f
			}
		case <-deadline:
			t.Fatalf("no %s line within 2 minutes", prefix)
		}
	}
}

// Every collective of a DDP job on gloo is counted, the same on both ranks,
// and the training is bit for bit what it is without the hook.
func TestCountsGlooCollectivesAndChangesNoResult(t *testing.T) {
	t.Parallel()
	py := python3(t)
	pyDir, out := install(t)
	const steps = 4
	sums := map[bool][2]string{}
	var ps [2]Progress
	for _, hooked := range []bool{false, true} {
		dir := ""
		if hooked {
			dir = out
		}
		rs := startJob(t, py, pyDir, dir, "STEPS="+strconv.Itoa(steps))
		var got [2]string
		for i, r := range rs {
			f := r.line(t, "RESULT")
			got[i] = f[3]
			if err := r.cmd.Wait(); err != nil {
				t.Fatalf("rank %d: %v", i, err)
			}
			if hooked {
				p, err := Read(filepath.Join(out, f[2]+".progress"))
				if err != nil {
					t.Fatal(err)
				}
				ps[i] = p
			}
		}
		sums[hooked] = got
	}
	if sums[true] != sums[false] {
		t.Errorf("parameters with the hook %v, without %v: want the same bits", sums[true], sums[false])
	}
	for i, p := range ps {
		// At least one bucket per step, then all_reduce, barrier and
		// broadcast_object_list (its inner collectives are not counted again).
		if p.Entered != p.Completed || p.Entered < steps+3 || p.PendingOp != "" {
			t.Errorf("rank %d: %+v; want every collective completed, at least %d", i, p, steps+3)
		}
		if p.CompletedAt.IsZero() || p.Wait <= 0 || len(p.RecentWaits) == 0 || p.RecentFirst+int64(len(p.RecentWaits))-1 != p.Completed {
			t.Errorf("rank %d: completion time, waits: %+v", i, p)
		}
	}
	if ps[0].Entered != ps[1].Entered {
		t.Errorf("rank 0 counted %d collectives, rank 1 %d; want the same", ps[0].Entered, ps[1].Entered)
	}
	t.Logf("%d collectives per rank", ps[0].Entered)
}

// A rank that stops calling collectives: the other's record shows it
// inside the next all-reduce, the stopped rank's shows it outside any.
func TestRecordShowsWhoIsInsideACollective(t *testing.T) {
	t.Parallel()
	py := python3(t)
	pyDir, out := install(t)
	rs := startJob(t, py, pyDir, out, "STEPS=4", "STOP_RANK=1")
	pids := [2]string{rs[0].line(t, "READY")[2], rs[1].line(t, "READY")[2]}
	rs[1].line(t, "STOPPED")
	var p0, p1 Progress
	testkit.WaitFor(t, time.Minute, "rank 0 inside an all-reduce rank 1 never enters", func() bool {
		var err0, err1 error
		p0, err0 = Read(filepath.Join(out, pids[0]+".progress"))
		p1, err1 = Read(filepath.Join(out, pids[1]+".progress"))
		return err0 == nil && err1 == nil && p0.PendingOp == "allreduce" && p0.Entered == p1.Completed+1
	})
	if p1.Entered != p1.Completed || p1.PendingOp != "" {
		t.Errorf("the stopped rank: %+v; want no open collective", p1)
	}
	if p0.PendingSince.IsZero() || p0.Completed != p1.Completed {
		t.Errorf("rank 0: %+v, rank 1: %+v", p0, p1)
	}
}

// A record caught mid-write (odd version) is read again; a file that is
// not a record is an error.
func TestReadWaitsOutAWriter(t *testing.T) {
	b := make([]byte, recordSize)
	copy(b, magic)
	binary.LittleEndian.PutUint64(b[8:], 3)
	path := filepath.Join(t.TempDir(), "1.progress")
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Read(path); err != ErrBusy {
		t.Errorf("Read of a record always mid-write: %v, want ErrBusy", err)
	}
	binary.LittleEndian.PutUint64(b[8:], 4)
	binary.LittleEndian.PutUint64(b[16:], 7)
	binary.LittleEndian.PutUint64(b[24:], 6)
	binary.LittleEndian.PutUint32(b[56:], 1)
	binary.LittleEndian.PutUint64(b[48:], uint64(time.Second))
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	p, err := Read(path)
	if err != nil || p.PendingOp != "allreduce" || p.Entered != 7 || p.Completed != 6 || !p.PendingSince.Equal(time.Unix(1, 0)) || p.RecentFirst != 1 || len(p.RecentWaits) != 6 {
		t.Errorf("Read = %+v, %v", p, err)
	}
	if err := os.WriteFile(path, []byte("hello"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Read(path); err == nil {
		t.Error("a file that is not a record read without an error")
	}
	recs, err := Records(filepath.Dir(path))
	if err != nil || recs[1] != path || len(recs) != 1 {
		t.Errorf("Records = %v, %v", recs, err)
	}
}

// A program that exits right after its steps, with its DDP model alive
// and its group not destroyed, exits 0. (A Python comm hook in DDP's
// reducer, which an earlier version of the hook registered, aborts such an
// exit about once in fifty: exit 134, "terminate called without an active
// exception"; the hook now leaves DDP's reducer alone.)
func TestExitWithModelAliveIsClean(t *testing.T) {
	t.Parallel()
	py := python3(t)
	pyDir, out := install(t)
	for i := range 6 {
		rs := startJob(t, py, pyDir, out, "STEPS=20", "NO_DESTROY=1")
		for r, rk := range rs {
			rk.line(t, "RESULT")
			if err := rk.cmd.Wait(); err != nil {
				t.Fatalf("run %d, rank %d exited: %v", i, r, err)
			}
		}
	}
}

// The agent sets only TORCH_NCCL_ASYNC_ERROR_HANDLING; a PyTorch before
// 2.2, which reads only the older name, gets that one from the hook when
// it calls init_process_group (a newer one does not, as it would warn).
func TestOlderTorchGetsTheOlderErrorHandlingName(t *testing.T) {
	t.Parallel()
	py := python3(t)
	pyDir, out := install(t)
	code := "import os, sys, torch, torch.distributed as dist\n" +
		"dist.init_process_group('gloo', init_method='file://' + sys.argv[1], rank=0, world_size=1)\n" +
		"v = tuple(int(x) for x in torch.__version__.split('+')[0].split('.')[:2])\n" +
		"print(v < (2, 2), os.environ.get('NCCL_ASYNC_ERROR_HANDLING', '-'))\n"
	cmd := exec.CommandContext(t.Context(), py, "-c", code, filepath.Join(t.TempDir(), "init"))
	cmd.Env = append(os.Environ(), "PYTHONPATH="+pyDir, EnvDir+"="+out, "TORCH_NCCL_ASYNC_ERROR_HANDLING=1")
	got, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%v\n%s", err, got)
	}
	switch f := strings.Fields(string(got)); {
	case len(f) != 2:
		t.Fatalf("output %q", got)
	case f[0] == "True" && f[1] != "1":
		t.Errorf("PyTorch before 2.2: NCCL_ASYNC_ERROR_HANDLING=%s, want 1", f[1])
	case f[0] == "False" && f[1] != "-":
		t.Errorf("PyTorch 2.2 or later: NCCL_ASYNC_ERROR_HANDLING=%s, want unset", f[1])
	}
}

// The recovery's timings: init_process_group, the restore the program
// reports through sys.modules["_gotrain_hook"], the first collective after
// it, and the installed packages the program imported.
func TestRecordsPhasesAndModules(t *testing.T) {
	t.Parallel()
	py := python3(t)
	pyDir, out := install(t)
	before := time.Now()
	rs := startJob(t, py, pyDir, out, "STEPS=3", "RESTORE_PHASE=1")
	for i, r := range rs {
		f := r.line(t, "RESULT")
		if err := r.cmd.Wait(); err != nil {
			t.Fatalf("rank %d: %v", i, err)
		}
		facts, err := ReadFacts(filepath.Join(out, f[2]+PhasesSuffix))
		if err != nil {
			t.Fatal(err)
		}
		byName := map[string][]Fact{}
		for _, p := range facts.Phases {
			byName[p.Phase] = append(byName[p.Phase], p)
		}
		init, restore, coll := byName["init_process_group"], byName["restore"], byName["collective"]
		if len(init) != 1 || init[0].Start.Before(before) || init[0].End.Before(init[0].Start) {
			t.Fatalf("rank %d: init_process_group %+v", i, init)
		}
		if len(restore) != 1 || restore[0].Seconds != 0.05 || restore[0].Bytes != 1234 || restore[0].Source != "agent" || restore[0].Step != 7 || restore[0].End.Before(init[0].End) {
			t.Errorf("rank %d: restore %+v", i, restore)
		}
		// One after init_process_group (none comes before the restore here:
		// DDP's construction broadcasts outside the counted calls) and one
		// after the restore: the first step's.
		if len(coll) != 1 || len(restore) == 1 && coll[0].End.Before(restore[0].End) {
			t.Errorf("rank %d: collectives %+v, want the first after the restore", i, coll)
		}
		if !slices.Contains(facts.Modules, "torch") || slices.Contains(facts.Modules, "os") || slices.Contains(facts.Modules, "gloo_steps") {
			t.Errorf("rank %d: modules %v, want torch and no standard or program module", i, facts.Modules)
		}
	}
}

// Lines that are not the hook's records are skipped; names are checked.
func TestParseFactsChecksWhatTheProgramWrote(t *testing.T) {
	in := `{"phase":"restore","seconds":0.5,"end":2000000000,"bytes":10,"source":"agent","step":3}
not json
{"phase":"../../etc","seconds":1,"end":5}
{"phase":"init_process_group","start":9,"end":5}
{"phase":"restore","seconds":-1,"end":5}
{"phase":"x","seconds":1,"end":5,"source":"a b"}
{"modules":["torch","os.path","transformers","torch","$x"]}
{"modules":["late"]}
{"phase":"collective","end":7`
	f := ParseFacts([]byte(in))
	if len(f.Phases) != 2 || f.Phases[0].Phase != "restore" || f.Phases[0].Bytes != 10 || f.Phases[1].Phase != "x" || f.Phases[1].Source != "" {
		t.Errorf("phases %+v", f.Phases)
	}
	if !slices.Equal(f.Modules, []string{"torch", "transformers"}) {
		t.Errorf("modules %v", f.Modules)
	}
}

func FuzzParseFacts(f *testing.F) {
	f.Add([]byte(`{"phase":"restore","seconds":0.5,"end":2,"bytes":10}` + "\n" + `{"modules":["a"]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		fc := ParseFacts(b)
		if len(fc.Modules) > maxModules {
			t.Fatal("too many modules")
		}
		for _, p := range fc.Phases {
			if !phaseName.MatchString(p.Phase) || p.End.IsZero() || p.Seconds < 0 {
				t.Fatalf("invalid %+v", p)
			}
		}
	})
}
