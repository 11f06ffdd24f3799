package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gotrain/gotrain/internal/testing/testkit"
)

// TestFailingEveryAttemptStopsAfterMaxRestarts: a rank that fails every
// time ends the job after --max-restarts restarts, with its exit status, a
// report naming it, and root-cause.json in the log dir.
func TestFailingEveryAttemptStopsAfterMaxRestarts(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	r := launch(t, time.Minute, "launch", "--nproc-per-node", "3", "--backend", "cpu", "--grace-period", "2s",
		"--max-restarts", "2", "--log-dir", dir, "--", bin.testprog, "exit", "--rank", "2", "--code", "7")
	if r.code != 7 {
		t.Fatalf("exit %d, want 7\nstderr:\n%s", r.code, r.stderr)
	}
	for _, want := range []string{
		"gotrain: job failed: rank 2 on ", "exit status 7", "all restarts are spent (max restarts 2)",
		"last 2 line(s) of rank 2's stderr", "exiting with 7 on purpose",
		// Every generation saw its restart count.
		"rank 2 restart count 0 (TORCHELASTIC_RESTART_COUNT=0)", "rank 2 restart count 1 (TORCHELASTIC_RESTART_COUNT=1)",
		"rank 2 restart count 2 (TORCHELASTIC_RESTART_COUNT=2)",
	} {
		if !strings.Contains(r.stderr, want) {
			t.Errorf("stderr lacks %q:\n%s", want, r.stderr)
		}
	}
	if strings.Contains(r.stderr, "restart count 3") {
		t.Errorf("a fourth attempt ran:\n%s", r.stderr)
	}
	b, err := os.ReadFile(filepath.Join(runLogDir(t, dir), "root-cause.json"))
	if err != nil {
		t.Fatal(err)
	}
	var rc struct {
		Succeeded    bool   `json:"succeeded"`
		ExitCode     int    `json:"exit_code"`
		Generation   int    `json:"generation"`
		RestartCount int    `json:"restart_count"`
		Message      string `json:"message"`
		Failure      struct {
			Rank       int      `json:"rank"`
			Hostname   string   `json:"hostname"`
			Pid        int      `json:"pid"`
			ExitCode   int      `json:"exit_code"`
			OOMKilled  bool     `json:"oom_killed"`
			StderrTail []string `json:"stderr_tail"`
		} `json:"failure"`
	}
	if err := json.Unmarshal(b, &rc); err != nil {
		t.Fatalf("root-cause.json: %v\n%s", err, b)
	}
	f := rc.Failure
	if rc.Succeeded || rc.ExitCode != 7 || rc.Generation != 2 || rc.RestartCount != 2 || f.Rank != 2 || f.ExitCode != 7 ||
		f.Pid <= 0 || f.Hostname == "" || f.OOMKilled || !slices.Contains(f.StderrTail, "rank 2 exiting with 7 on purpose") {
		t.Errorf("root-cause.json:\n%s", b)
	}
}

// TestSignalsAreForwarded: SIGUSR1, SIGUSR2 and SIGHUP reach every worker
// (preemption notices); SIGINT and SIGTERM reach them and stop the job.
func TestSignalsAreForwarded(t *testing.T) {
	t.Parallel()
	for _, stop := range []syscall.Signal{syscall.SIGINT, syscall.SIGTERM} {
		t.Run(stop.String(), func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			cmd := gotrainCmd(context.Background(), t, nil, "launch", "--nproc-per-node", "2", "--backend", "cpu", "--grace-period", "5s",
				"--", bin.testprog, "signals", "--pid-dir", dir)
			var out, errb testkit.Buffer
			cmd.Stdout, cmd.Stderr = &out, &errb
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
			testkit.WaitFor(t, time.Minute, "both workers ready", func() bool {
				m, _ := filepath.Glob(filepath.Join(dir, "ready-*"))
				return len(m) == 2
			})
			for _, s := range []syscall.Signal{syscall.SIGUSR1, syscall.SIGUSR2, syscall.SIGHUP} {
				if err := cmd.Process.Signal(s); err != nil {
					t.Fatal(err)
				}
				name := "got " + sigName(s)
				testkit.WaitFor(t, 30*time.Second, name+" on both ranks", func() bool {
					o := out.String()
					return strings.Contains(o, "[rank 0] "+name+"\n") && strings.Contains(o, "[rank 1] "+name+"\n")
				})
			}
			if err := cmd.Process.Signal(stop); err != nil {
				t.Fatal(err)
			}
			_ = cmd.Wait()
			if code := cmd.ProcessState.ExitCode(); code != 128+int(stop) {
				t.Errorf("exit %d, want %d\nstderr:\n%s", code, 128+int(stop), errb.String())
			}
			for rank := range 2 {
				if want := fmt.Sprintf("[rank %d] got %s\n", rank, sigName(stop)); !strings.Contains(out.String(), want) {
					t.Errorf("stdout lacks %q:\n%s", want, out.String())
				}
			}
			waitNoLeftovers(t, 5*time.Second, cmd.Process.Pid)
		})
	}
}

func sigName(s syscall.Signal) string {
	return map[syscall.Signal]string{syscall.SIGUSR1: "SIGUSR1", syscall.SIGUSR2: "SIGUSR2", syscall.SIGHUP: "SIGHUP",
		syscall.SIGINT: "SIGINT", syscall.SIGTERM: "SIGTERM"}[s]
}

// TestChaosMNIST SIGKILLs a random worker five times while MNIST trains with
// checkpoints. Every kill ends a generation, the next one resumes from the
// newest checkpoint, and the job must still reach the accuracy of an
// undisturbed run, with identical weights on every rank and no process left.
//
// It does not run in parallel with the other tests: a SIGKILLed rank's peer
// fails its all-reduce and exits 1 moments later, and on a machine loaded by
// the parallel tests the agent can see that exit first and end the
// generation for it instead of the SIGKILL the test counts.
func TestChaosMNIST(t *testing.T) {
	if testing.Short() {
		t.Skip("trains for several seconds")
	}
	const ranks, kills = 2, 5
	ckpt := t.TempDir()
	cmd := gotrainCmd(context.Background(), t, nil, "launch", "--nproc-per-node", strconv.Itoa(ranks), "--backend", "cpu",
		"--max-restarts", "8", "--grace-period", "3s", "--log-dir", t.TempDir(),
		"--", bin.mnist, "--epochs", "3", "--checkpoint-dir", ckpt, "--checkpoint-every", "150")
	var out, errb testkit.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("the job's stdout:\n%s\nstderr:\n%s", out.String(), errb.String())
		}
	})
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()

	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 5))
	killed := map[int]bool{}
	for k := range kills {
		// The generation's workers, none of them killed before, have trained
		// for a while: wait for a checkpoint newer than the last kill's.
		before := checkpoints(ckpt)
		var workers []int
		testkit.WaitFor(t, 2*time.Minute, fmt.Sprintf("kill %d: a new generation with progress", k+1), func() bool {
			workers = workers[:0]
			for _, pid := range descendants(cmd.Process.Pid, bin.mnist) {
				if !killed[pid] {
					workers = append(workers, pid)
				}
			}
			if len(workers) == ranks && checkpoints(ckpt) > before {
				return true
			}
			select {
			case err := <-done:
				t.Fatalf("the job ended (%v) before kill %d\nstdout:\n%s\nstderr:\n%s", err, k+1, out.String(), errb.String())
			default:
			}
			return false
		})
		victim := workers[rng.IntN(len(workers))]
		killed[victim] = true
		t.Logf("kill %d: SIGKILL pid %d", k+1, victim)
		if err := syscall.Kill(victim, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case <-done:
	case <-time.After(5 * time.Minute):
		t.Fatalf("the job did not finish\nstdout:\n%s\nstderr:\n%s", out.String(), errb.String())
	}
	if code := cmd.ProcessState.ExitCode(); code != 0 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, out.String(), errb.String())
	}
	m := finalLine.FindStringSubmatch(out.String())
	if m == nil {
		t.Fatalf("no final line:\n%s", out.String())
	}
	acc, _ := strconv.ParseFloat(m[1], 64)
	if acc < 0.97 || m[2] != "true" {
		t.Errorf("test_accuracy=%v ranks_agree=%s, want ≥ 0.97 and true\n%s", acc, m[2], out.String())
	}
	if n := strings.Count(out.String(), "[rank 0] resumed at epoch"); n != kills {
		t.Errorf("%d resumes, want %d:\n%s", n, kills, out.String())
	}
	if n := len(killedRestart.FindAllString(errb.String(), -1)); n != kills {
		t.Errorf("%d generations ended by SIGKILL, want %d:\n%s", n, kills, errb.String())
	}
	waitNoLeftovers(t, 5*time.Second, cmd.Process.Pid)
}

// killedRestart is the restart line of a rank killed by SIGKILL (its last
// line quoted in parentheses when it printed one).
var killedRestart = regexp.MustCompile(`(?m)^gotrain: rank \d+ on \S+ was killed by SIGKILL.*: restarting all`)

// checkpoints counts the checkpoints written so far: the newest step.
func checkpoints(dir string) int64 {
	m, _ := filepath.Glob(filepath.Join(dir, "ckpt-*.gtck"))
	var newest int64
	for _, f := range m {
		s := strings.TrimSuffix(strings.TrimPrefix(filepath.Base(f), "ckpt-"), ".gtck")
		if n, err := strconv.ParseInt(s, 10, 64); err == nil && n > newest {
			newest = n
		}
	}
	return newest
}
