package integration

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gotrain/gotrain/internal/netport"
	"github.com/gotrain/gotrain/internal/testing/testkit"
)

// In every phase — waiting for the coordinator, for the
// other nodes, for a restart, for workers within their grace period, for a
// coordinator that stopped answering, for the node's agent under Slurm —
// SIGINT and SIGTERM stop gotrain at once, with 128+signal and a last line
// that names what it was waiting for, and leave nothing behind. Each test
// waits for a line that proves gotrain is in the phase (--verbose logs
// each phase as it begins), signals it, and measures how long it took to
// end: the bound is generous (under load), the point is "not 480 s".

// stopBound is how long a signaled gotrain may take to end in these tests;
// it ends within a second on an idle machine.
const stopBound = 5 * time.Second

// sigJob is a gotrain process of a signal test, with its own TMPDIR
// (socket dirs) and XDG_RUNTIME_DIR (run and token files), so that what it
// leaves behind can be checked.
type sigJob struct {
	*job
	tmp, runtime string
}

func startSigJob(t *testing.T, env []string, args ...string) *sigJob {
	t.Helper()
	// A short TMPDIR: a unix socket's path has at most 107 bytes.
	tmp, err := os.MkdirTemp("", "gs")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(tmp) })
	j := &sigJob{job: &job{done: make(chan struct{})}, tmp: tmp, runtime: t.TempDir()}
	j.cmd = gotrainCmd(context.Background(), t, append([]string{"TMPDIR=" + tmp, "XDG_RUNTIME_DIR=" + j.runtime}, env...), args...)
	j.cmd.Stdout, j.cmd.Stderr = &j.out, &j.err
	if err := j.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = j.cmd.Wait(); close(j.done) }()
	t.Cleanup(func() {
		_ = j.cmd.Process.Kill()
		<-j.done
		if t.Failed() {
			t.Logf("gotrain %v\nstdout:\n%s\nstderr:\n%s", j.cmd.Args[1:], j.out.String(), j.err.String())
		}
	})
	return j
}

// phaseLine is the agent's --verbose log of a phase that begins.
func phaseLine(phase string) *regexp.Regexp {
	return regexp.MustCompile(`msg=phase .*phase="` + regexp.QuoteMeta(phase))
}

// waitPhase waits until j logged that it is in phase (phaseLine).
func (j *sigJob) waitPhase(t *testing.T, phase string) {
	t.Helper()
	re := phaseLine(phase)
	waitOutput(t, j.job, "phase "+phase, func() bool { return re.MatchString(j.err.String()) })
}

// stop sends sig to j and checks that it ends within stopBound with
// 128+sig, that its last line is "gotrain: stopped by SIG while PHASE (Ns)"
// (want: the line up to the duration), and that nothing of its job is left:
// no process (but those of keep, other processes of the test), no socket
// dir, no run or token file.
func (j *sigJob) stop(t *testing.T, sig syscall.Signal, want string, keep ...int) {
	t.Helper()
	sent := time.Now()
	if err := j.cmd.Process.Signal(sig); err != nil {
		t.Fatal(err)
	}
	j.stopped(t, sig, sent, want, keep...)
}

// stopped is stop's check, for a job that was sent its last signal at sent.
func (j *sigJob) stopped(t *testing.T, sig syscall.Signal, sent time.Time, want string, keep ...int) {
	t.Helper()
	code := j.wait(t, time.Minute)
	took := time.Since(sent)
	if code != 128+int(sig) {
		t.Errorf("exit status %d, want %d (128+%s)", code, 128+int(sig), sigName(sig))
	}
	if took > stopBound {
		t.Errorf("gotrain took %s to end after %s, want it within %s (a second when idle)", took.Round(time.Millisecond), sigName(sig), stopBound)
	}
	lines := strings.Split(strings.TrimRight(j.err.String(), "\n"), "\n")
	last := lines[len(lines)-1]
	if !strings.HasPrefix(last, want) || !regexp.MustCompile(`\(\d+s\)`).MatchString(last) {
		t.Errorf("last line of stderr:\n  %s\nwant it to begin %q and say for how long", last, want)
	}
	t.Logf("%s ended gotrain in %s: %s", sigName(sig), took.Round(time.Millisecond), last)
	var left []proc
	testkit.WaitFor(t, stopBound, "no process of the job left", func() bool {
		left = slices.DeleteFunc(leftovers(t), func(p proc) bool { return slices.Contains(keep, p.pid) })
		return len(left) == 0
	})
	if len(left) > 0 {
		t.Errorf("processes left: %+v", left)
	}
	socks, _ := filepath.Glob(filepath.Join(j.tmp, "gotrain-agent-*"))
	files, _ := filepath.Glob(filepath.Join(j.runtime, "gotrain", "*"))
	if len(socks)+len(files) > 0 {
		t.Errorf("left behind: socket dirs %v, run and token files %v", socks, files)
	}
}

// freeAddr is a loopback address where nothing listens.
func freeAddr(t *testing.T) string {
	t.Helper()
	p, err := netport.Unclaimed("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(p))
}

// The case: a joining node whose coordinator is not there.
func TestSignalWhileWaitingForTheCoordinator(t *testing.T) {
	t.Parallel()
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT} {
		t.Run(sigName(sig), func(t *testing.T) {
			t.Parallel()
			addr := freeAddr(t)
			j := startSigJob(t, nil, "launch", "--verbose", "--nnodes", "2", "--nproc-per-node", "1", "--backend", "cpu", "--node-addr", "127.0.0.1",
				"--coordinator", addr, "--ca-hash", "sha256:"+strings.Repeat("ab", 32), "--job-token", "signal-test-token", "--", "true")
			j.waitPhase(t, "waiting for the coordinator at "+addr)
			j.stop(t, sig, fmt.Sprintf("gotrain: stopped by %s while waiting for the coordinator at %s (", sigName(sig), addr))
		})
	}
}

// The first node of two, with nobody else: its embedded coordinator waits
// for the other node (and its token file is removed).
func TestSignalWhileWaitingForTheOtherNodes(t *testing.T) {
	t.Parallel()
	j := startSigJob(t, nil, "launch", "--verbose", "--nnodes", "2", "--nproc-per-node", "1", "--backend", "cpu", "--node-addr", "127.0.0.1",
		"--coordinator-listen", "127.0.0.1:0", "--", "true")
	j.waitPhase(t, "waiting for the job's other nodes to join")
	if files, _ := filepath.Glob(filepath.Join(j.runtime, "gotrain", "*")); len(files) == 0 {
		t.Errorf("no token or run file in %s while the job waits: the test would not see one left behind", j.runtime)
	}
	j.stop(t, syscall.SIGTERM, "gotrain: stopped by SIGTERM while waiting for the job's other nodes to join (--nnodes 2) (")
}

// A worker that fails at once, and a long --restart-backoff: the signal
// comes while the job waits to restart.
func TestSignalDuringRestartBackoff(t *testing.T) {
	t.Parallel()
	j := startSigJob(t, nil, "launch", "--verbose", "--nproc-per-node", "1", "--backend", "cpu",
		"--max-restarts", "3", "--restart-backoff", "60s", "--", "false")
	j.waitPhase(t, "waiting for the job's next generation (generation 0 ended")
	j.stop(t, syscall.SIGINT, "gotrain: stopped by SIGINT while waiting for the job's next generation (generation 0 ended")
}

// A worker that ignores SIGTERM, with --grace-period 60s: the first signal
// leaves it its grace period, the second kills it at once.
func TestSignalTwiceKillsWorkersInTheirGracePeriod(t *testing.T) {
	t.Parallel()
	pids := t.TempDir()
	j := startSigJob(t, nil, "launch", "--verbose", "--nproc-per-node", "2", "--backend", "cpu", "--grace-period", "60s",
		"--", bin.testprog, "sleep", "--ignore-term", "--pid-dir", pids)
	j.waitPhase(t, "running generation 0")
	testkit.WaitFor(t, time.Minute, "4 pid files (2 workers and their children)", func() bool {
		files, _ := filepath.Glob(filepath.Join(pids, "*.pid"))
		return len(files) == 4
	})
	if err := j.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	waitOutput(t, j.job, "the first signal's line", func() bool {
		return strings.Contains(j.err.String(), "gotrain: SIGTERM received: stopping 2 worker(s) (SIGKILL in 1m0s")
	})
	// The workers ignore it: they, and gotrain, run on in their grace period.
	for _, f := range must(filepath.Glob(filepath.Join(pids, "worker-*.pid"))) {
		pid, _ := strconv.Atoi(string(must(os.ReadFile(f))))
		if !alive(pid) {
			t.Errorf("worker %d is gone after the first SIGTERM; it ignores SIGTERM and has a grace period of 60s", pid)
		}
	}
	select {
	case <-j.done:
		t.Fatalf("gotrain ended after the first SIGTERM, within the workers' grace period")
	default:
	}
	sent := time.Now()
	if err := j.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	j.stopped(t, syscall.SIGTERM, sent, "gotrain: stopped by SIGTERM while running generation 0 (")
	if !strings.Contains(j.err.String(), "a second SIGTERM killed the workers at once") {
		t.Errorf("the last line does not say that the second signal killed the workers")
	}
}

// A standby warming up (a program that never says hello, and a long
// --standby-timeout): the signal stops it with the workers.
func TestSignalWhileAStandbyWarmsUp(t *testing.T) {
	t.Parallel()
	j := startSigJob(t, nil, "launch", "--verbose", "--nproc-per-node", "1", "--backend", "cpu", "--standby", "on", "--standby-timeout", "60s",
		"--", bin.testprog, "sleep", "--pid-dir", t.TempDir())
	waitOutput(t, j.job, "a standby and the worker", func() bool {
		return standbyLine.MatchString(j.out.String()) && strings.Contains(j.out.String(), "[rank 0] sleeping")
	})
	if strings.Contains(j.err.String(), "standby ready") {
		t.Fatalf("the standby said hello: it is not warming up")
	}
	j.stop(t, syscall.SIGTERM, "gotrain: stopped by SIGTERM while running generation 0 (")
}

// A node cut off from its coordinator: a standalone `gotrain coordinator`,
// SIGSTOPped while the agent's worker runs. The agent waits for it to
// answer again (its workers run on) and SIGTERM ends that wait.
func TestSignalWhileCutOffFromTheCoordinator(t *testing.T) {
	t.Parallel()
	coord := startSigJob(t, nil, "coordinator", "--nnodes", "1", "--listen", "127.0.0.1:0", "--node-timeout", "60s")
	join := joinArgs(t, coord.job)
	pids := t.TempDir()
	j := startSigJob(t, nil, slices.Concat([]string{"launch", "--verbose", "--nnodes", "1", "--nproc-per-node", "1", "--backend", "cpu", "--node-addr", "127.0.0.1"},
		join, []string{"--", bin.testprog, "sleep", "--pid-dir", pids})...)
	j.waitPhase(t, "running generation 0")
	if err := coord.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = coord.cmd.Process.Signal(syscall.SIGCONT) })
	addr := join[1]
	j.waitPhase(t, "waiting for the coordinator at "+addr+" to answer again")
	j.stop(t, syscall.SIGTERM, "gotrain: stopped by SIGTERM while waiting for the coordinator at "+addr+" to answer again", coord.cmd.Process.Pid)
}

// A standalone coordinator waiting for its nodes.
func TestSignalToAStandaloneCoordinatorWaitingForNodes(t *testing.T) {
	t.Parallel()
	coord := startSigJob(t, nil, "coordinator", "--nnodes", "2", "--listen", "127.0.0.1:0")
	coord.waitPhase(t, "waiting for the job's nodes to join (0 of --nnodes 2 joined)")
	coord.stop(t, syscall.SIGTERM, "gotrain coordinator: stopped by SIGTERM while waiting for the job's nodes to join (0 of --nnodes 2 joined) (")
}

// One replica of a replicated coordinator whose two peers never come: it
// has no majority, and waits for one.
func TestSignalToACoordinatorReplicaWithoutMajority(t *testing.T) {
	t.Parallel()
	// Three replicas' ports, each free with its gossip (+1) and Raft (+3)
	// ports; only the first replica runs.
	var peers []string
	for len(peers) < 3 {
		addr := freeAddr(t)
		_, p, _ := net.SplitHostPort(addr)
		port, _ := strconv.Atoi(p)
		free := true
		for _, off := range []int{1, 3} {
			l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port+off)))
			if err != nil {
				free = false
				break
			}
			l.Close()
		}
		if free {
			peers = append(peers, addr)
		}
	}
	coord := startSigJob(t, nil, "coordinator", "--nnodes", "1", "--peers", strings.Join(peers, ","), "--listen", peers[0],
		"--job-token", "signal-test-token-long-enough-to-derive-the-replicas-CA")
	coord.waitPhase(t, "waiting for a majority of its --peers to elect a leader")
	coord.stop(t, syscall.SIGINT, "gotrain coordinator: stopped by SIGINT while waiting for a majority of its --peers to elect a leader (")
}

// Under Slurm with several tasks per node, a task with SLURM_LOCALID > 0
// waits for the node's agent (the task with SLURM_LOCALID 0), which here
// never comes.
func TestSignalToASlurmTaskWaitingForItsAgent(t *testing.T) {
	t.Parallel()
	// A job id of this test process's own: the tasks meet on an abstract
	// socket named after the step.
	job := strconv.Itoa(900000 + os.Getpid()%100000)
	env := []string{"SLURM_JOB_ID=" + job, "SLURM_STEP_ID=0", "SLURM_STEP_NODELIST=localhost", "SLURM_STEP_NUM_NODES=1",
		"SLURM_NODEID=0", "SLURM_LOCALID=1", "SLURM_STEP_TASKS_PER_NODE=2", "GOTRAIN_SLURM="}
	j := startSigJob(t, env, "launch", "--verbose", "--nproc-per-node", "1", "--backend", "cpu", "--", "true")
	phase := fmt.Sprintf("waiting for this node's agent (the task with SLURM_LOCALID 0 of step %s.0) to start", job)
	j.waitPhase(t, phase)
	j.stop(t, syscall.SIGTERM, "gotrain: stopped by SIGTERM while "+phase+" (")
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}
