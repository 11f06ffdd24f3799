// Package slurmtest runs gotrain under a real Slurm 22.05 cluster made by
// the test on this machine: one munged, slurmctld in a namespace of its own
// (hostname ctl) and one slurmd per compute node (node1..node3), each in
// its own network namespace (internal/testing/vcluster), mount namespace (its own
// /etc/hosts) and hostname, as ../../../shared/CLUSTER.md describes. Every
// daemon is started by the test and stopped by pid; the namespaces go at
// cleanup.
//
// It needs root and Debian's slurmctld, slurmd, slurm-client and munge
// (.ci/run installs them). Without them it skips, saying why; with $CI set
// it fails instead.
package slurmtest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gotrain/gotrain/internal/testing/testbin"
	"github.com/gotrain/gotrain/internal/testing/testkit"

	"github.com/gotrain/gotrain/internal/testing/vcluster"
)

var bin struct{ dir, gotrain, mnist, data string }

func TestMain(m *testing.M) {
	pkgs := []string{"./cmd/gotrain", "./examples/mnist"}
	testbin.Main(m, "gotrain-slurmtest-", pkgs, func(dir string, built map[string]string) (err error) {
		// The steps' processes run the binaries from this directory: open
		// it to every user, as MkdirTemp's 0700 would not.
		if err := os.Chmod(dir, 0o755); err != nil {
			return err
		}
		bin.dir, bin.gotrain, bin.mnist = dir, built[pkgs[0]], built[pkgs[1]]
		bin.data, err = testbin.MNISTData()
		return err
	})
}

// cluster is a running Slurm cluster.
type cluster struct {
	t     *testing.T
	vc    *vcluster.Cluster
	dir   string
	conf  string
	nodes []*vcluster.Host // node1..node3
	ctl   *vcluster.Host
	pids  map[string]int // daemon name -> pid
}

func missingTools() error {
	for _, tool := range []string{"slurmctld", "slurmd", "sbatch", "srun", "squeue", "scancel", "munged", "munge", "unmunge", "mungekey", "nsenter", "unshare", "ip"} {
		if _, err := exec.LookPath(tool); err != nil {
			return fmt.Errorf("%s not found (Debian packages slurmctld slurmd slurm-client munge util-linux iproute2): %w", tool, err)
		}
	}
	if os.Geteuid() != 0 {
		return fmt.Errorf("a Slurm cluster needs root")
	}
	return nil
}

func newCluster(t *testing.T, nodes int) *cluster {
	t.Helper()
	if err := missingTools(); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("slurmtest: %v (CI is set: this test must run in CI)", err)
		}
		t.Skipf("slurmtest: %v", err)
	}
	vc := vcluster.New(t, nodes+1, vcluster.Options{})
	dir, err := os.MkdirTemp("", "gtslurm-")
	if err != nil {
		t.Fatal(err)
	}
	os.Chmod(dir, 0o755) // munged wants its socket's directories searchable
	c := &cluster{t: t, vc: vc, dir: dir, ctl: vc.Hosts[0], nodes: vc.Hosts[1:], pids: map[string]int{}}
	// Registered after vcluster.New: runs before its teardown.
	t.Cleanup(c.stop)

	hosts := "127.0.0.1 localhost\n" + c.ctl.IP + " ctl\n"
	var nodeLines []string
	for i, h := range c.nodes {
		name := fmt.Sprintf("node%d", i+1)
		hosts += h.IP + " " + name + "\n"
		nodeLines = append(nodeLines, fmt.Sprintf("NodeName=%s NodeAddr=%s CPUs=2 State=UNKNOWN", name, h.IP))
	}
	c.write("hosts", hosts)
	for _, d := range []string{"state", "spool"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for i := range c.nodes {
		os.MkdirAll(filepath.Join(dir, "spool", fmt.Sprintf("node%d", i+1)), 0o755)
	}
	sock := filepath.Join(dir, "munge.sock")
	c.conf = c.write("slurm.conf", fmt.Sprintf(`ClusterName=gtslurm
SlurmctldHost=ctl(%s)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=%s
StateSaveLocation=%s/state
SlurmdSpoolDir=%s/spool/%%n
SlurmctldPidFile=%s/slurmctld.pid
SlurmdPidFile=%s/slurmd-%%n.pid
SlurmctldLogFile=%s/slurmctld.log
SlurmdLogFile=%s/slurmd-%%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
ReturnToService=2
SlurmdParameters=config_overrides
KillWait=5
MailProg=/bin/true
%s
PartitionName=p Nodes=ALL Default=YES OverSubscribe=YES MaxTime=INFINITE State=UP
`, c.ctl.IP, sock, dir, dir, dir, dir, dir, dir, strings.Join(nodeLines, "\n")))

	key := filepath.Join(dir, "munge.key")
	c.run("mungekey", "--create", "--keyfile="+key)
	c.daemon("munged", []string{"munged", "--foreground", "--force", "--socket=" + sock, "--key-file=" + key,
		"--pid-file=" + filepath.Join(dir, "munged.pid"), "--log-file=" + filepath.Join(dir, "munged.log"), "--seed-file=" + filepath.Join(dir, "munged.seed")})
	c.waitFor("munged's socket", 5*time.Second, func() bool { _, err := os.Stat(sock); return err == nil })

	c.daemon("slurmctld", c.inNode(c.ctl, "ctl", "slurmctld", "-D", "-f", c.conf))
	for i, h := range c.nodes {
		name := fmt.Sprintf("node%d", i+1)
		c.daemon("slurmd-"+name, c.inNode(h, name, "slurmd", "-D", "-f", c.conf, "-N", name))
	}
	c.waitFor("every node idle", 30*time.Second, func() bool {
		out, _ := c.client("sinfo", "-h", "-o", "%t", "-N")
		s := strings.Fields(string(out))
		if len(s) != len(c.nodes) {
			return false
		}
		for _, st := range s {
			if st != "idle" {
				return false
			}
		}
		return true
	})
	return c
}

// inNode is the command line that runs args on h as CLUSTER.md says:
// nsenter (not ip netns exec: slurmd needs /sys/fs/cgroup), its own mount
// namespace with the cluster's /etc/hosts, its own hostname.
func (c *cluster) inNode(h *vcluster.Host, name string, args ...string) []string {
	return append([]string{"nsenter", "--net=/run/netns/" + h.NS, "unshare", "--mount", "--uts", "--propagation", "private",
		"sh", "-c", `mount --bind "$0" /etc/hosts && hostname "$1" && shift && exec "$@"`, filepath.Join(c.dir, "hosts"), name}, args...)
}

func (c *cluster) write(name, content string) string {
	p := filepath.Join(c.dir, name)
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		c.t.Fatal(err)
	}
	return p
}

func (c *cluster) run(args ...string) {
	c.t.Helper()
	if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
		c.t.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// daemon starts args in the foreground of a process group of its own and
// remembers its pid.
func (c *cluster) daemon(name string, args []string) {
	c.t.Helper()
	cmd := exec.Command(args[0], args[1:]...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	log, err := os.Create(filepath.Join(c.dir, name+".out"))
	if err != nil {
		c.t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		c.t.Fatalf("start %s: %v", name, err)
	}
	log.Close()
	c.pids[name] = cmd.Process.Pid
	go cmd.Wait()
}

// client runs a Slurm client command in the controller's namespace.
func (c *cluster) client(args ...string) ([]byte, error) {
	cmd := exec.Command("ip", append([]string{"netns", "exec", c.ctl.NS}, args...)...)
	cmd.Env = append(os.Environ(), "SLURM_CONF="+c.conf)
	return cmd.CombinedOutput()
}

func (c *cluster) waitFor(what string, d time.Duration, ok func() bool) {
	c.t.Helper()
	defer func() {
		if c.t.Failed() {
			c.t.Logf("slurmtest: the cluster's logs:\n%s", c.logs())
		}
	}()
	testkit.WaitFor(c.t, d, "slurmtest: "+what, ok)
}

func (c *cluster) logs() string {
	var b strings.Builder
	files, _ := filepath.Glob(filepath.Join(c.dir, "*.log"))
	outs, _ := filepath.Glob(filepath.Join(c.dir, "*.out"))
	for _, f := range append(files, outs...) {
		data, _ := os.ReadFile(f)
		lines := strings.Split(string(data), "\n")
		if len(lines) > 15 {
			lines = lines[len(lines)-15:]
		}
		fmt.Fprintf(&b, "--- %s:\n%s\n", filepath.Base(f), strings.Join(lines, "\n"))
	}
	return b.String()
}

// stop stops every daemon by its pid (SIGTERM, then SIGKILL) and removes
// the cluster's files.
func (c *cluster) stop() {
	if c.t.Failed() {
		c.t.Logf("slurm logs:\n%s", c.logs())
	}
	for _, pid := range c.pids {
		_ = syscall.Kill(-pid, syscall.SIGTERM)
	}
	deadline := time.Now().Add(5 * time.Second)
	for name, pid := range c.pids {
		for vcluster.Alive(pid) && time.Now().Before(deadline) {
			time.Sleep(50 * time.Millisecond)
		}
		if vcluster.Alive(pid) {
			_ = syscall.Kill(-pid, syscall.SIGKILL)
			c.t.Logf("slurmtest: %s (pid %d) killed", name, pid)
		}
	}
	os.RemoveAll(c.dir)
}

// sbatch submits script and returns the job id; the job writes to out.
func (c *cluster) sbatch(script string, args ...string) (string, string) {
	c.t.Helper()
	out := filepath.Join(c.dir, fmt.Sprintf("job-%d.out", time.Now().UnixNano()))
	p := c.write(fmt.Sprintf("job-%d.sh", time.Now().UnixNano()), script)
	b, err := c.client(append([]string{"sbatch", "--parsable", "-o", out, "-D", c.dir}, append(args, p)...)...)
	if err != nil {
		c.t.Fatalf("sbatch: %v\n%s", err, b)
	}
	return strings.TrimSpace(string(b)), out
}

// wait waits for job to leave the queue.
func (c *cluster) wait(job string, d time.Duration) {
	c.t.Helper()
	c.waitFor("end of job "+job, d, func() bool {
		out, err := c.client("squeue", "-h", "-j", job, "-o", "%T")
		return err != nil || strings.TrimSpace(string(out)) == ""
	})
}

func readFile(t *testing.T, p string) string {
	b, _ := os.ReadFile(p)
	return string(b)
}

// leftOver are the processes on the compute nodes other than slurmd.
func (c *cluster) leftOver() []string {
	var left []string
	for _, h := range c.nodes {
		out, _ := exec.Command("ip", "netns", "pids", h.NS).Output()
		for _, f := range strings.Fields(string(out)) {
			pid, _ := strconv.Atoi(f)
			if !vcluster.Alive(pid) {
				continue
			}
			cmd, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
			s := strings.ReplaceAll(strings.TrimRight(string(cmd), "\x00"), "\x00", " ")
			if strings.HasPrefix(s, "slurmd ") || strings.HasPrefix(s, "nsenter ") || strings.HasPrefix(s, "unshare ") {
				continue
			}
			left = append(left, fmt.Sprintf("%s: %d %s", h.Name, pid, s))
		}
	}
	return left
}

// agentPid is the pid of the gotrain agent on the compute node i (0:
// node1), 0 if none.
func (c *cluster) agentPid(i int) int {
	out, _ := exec.Command("ip", "netns", "pids", c.nodes[i].NS).Output()
	for _, f := range strings.Fields(string(out)) {
		pid, _ := strconv.Atoi(f)
		cmd, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		args := strings.Split(strings.TrimRight(string(cmd), "\x00"), "\x00")
		if len(args) > 2 && filepath.Base(args[0]) == "gotrain" && args[1] == "launch" && args[2] != "_reaper" {
			return pid
		}
	}
	return 0
}

var final = regexp.MustCompile(`(?m)^\[rank 0\] final test_accuracy=[0-9.]+ ranks_agree=true$`)

// readmeScript is docs/clusters.md's sbatch example, with the paths of this test.
func readmeScript(nodes int) string {
	return fmt.Sprintf(`#!/bin/bash
#SBATCH --nodes=%d --ntasks-per-node=1
srun gotrain launch --backend cpu --nproc-per-node 1 -- %s --data %s --epochs 1 --limit 4000
`, nodes, bin.mnist, bin.data)
}

func TestSlurm(t *testing.T) {
	start := time.Now()
	c := newCluster(t, 3)
	t.Logf("cluster up in %s", time.Since(start).Round(10*time.Millisecond))
	t.Setenv("PATH", bin.dir+":"+os.Getenv("PATH")) // srun's tasks inherit sbatch's environment

	t.Run("mnist on 2 nodes", func(t *testing.T) {
		t0 := time.Now()
		job, out := c.sbatch(readmeScript(2))
		c.wait(job, 60*time.Second)
		o := readFile(t, out)
		if !final.MatchString(o) {
			t.Fatalf("job %s: no ranks_agree=true in its output:\n%s", job, o)
		}
		if strings.Contains(o, "export "+"GOTRAIN_JOB_TOKEN=") || regexp.MustCompile(`(^|[^:0-9a-f])[0-9a-f]{32}([^0-9a-f]|$)`).MatchString(o) {
			t.Errorf("job %s's output may show a secret:\n%s", job, o)
		}
		t.Logf("2-node MNIST job in %s", time.Since(t0).Round(10*time.Millisecond))
	})

	t.Run("step on part of the allocation, one task per CPU", func(t *testing.T) {
		t0 := time.Now()
		job, out := c.sbatch(fmt.Sprintf(`#!/bin/bash
srun -N2 -n2 -w node2,node3 gotrain launch --verbose --backend cpu --nproc-per-node 1 -- %s --data %s --epochs 1 --limit 2000
srun -N2 -n4 -w node2,node3 --ntasks-per-node=2 gotrain launch --backend cpu -- %s --data %s --epochs 1 --limit 2000
`, bin.mnist, bin.data, bin.mnist, bin.data), "-N3", "--ntasks-per-node=2")
		c.wait(job, 80*time.Second)
		o := readFile(t, out)
		if n := len(final.FindAllString(o, -1)); n != 2 {
			t.Fatalf("job %s: %d of 2 steps with ranks_agree=true:\n%s", job, n, o)
		}
		if !strings.Contains(o, "node 0 of 2 (node2,node3)") {
			t.Errorf("job %s: node2 did not run the coordinator:\n%s", job, o)
		}
		if !strings.Contains(o, "[rank 0] mnist: 4 ranks,") {
			t.Errorf("job %s: --ntasks-per-node=2 on 2 nodes did not make 4 ranks:\n%s", job, o)
		}
		t.Logf("two steps on node2,node3 of a 3-node job in %s", time.Since(t0).Round(10*time.Millisecond))
	})

	t.Run("mnist on 3 nodes, 2 ranks each", func(t *testing.T) {
		t0 := time.Now()
		job, out := c.sbatch(fmt.Sprintf(`#!/bin/bash
srun gotrain launch --nproc-per-node 2 --backend cpu -- %s --data %s --epochs 1 --limit 3000
`, bin.mnist, bin.data), "-N3")
		c.wait(job, 90*time.Second)
		o := readFile(t, out)
		if !final.MatchString(o) || !strings.Contains(o, "[rank 0] mnist: 6 ranks,") {
			t.Fatalf("job %s: no 6-rank ranks_agree=true in its output:\n%s", job, o)
		}
		t.Logf("3-node x 2-rank MNIST job in %s", time.Since(t0).Round(10*time.Millisecond))
	})

	// Rank 3 (node2's first) fails in the first generation: every rank of
	// the three nodes starts again, with restart count 1.
	t.Run("worker crash restarts the job across nodes", func(t *testing.T) {
		t0 := time.Now()
		job, out := c.sbatch(`#!/bin/bash
srun gotrain launch --nproc-per-node 2 --backend cpu -- sh -c '
if [ "$GOTRAIN_RESTART_COUNT" = 0 ]; then
  echo "first try on $(hostname)"
  if [ "$RANK" = 3 ]; then sleep 1; echo "rank 3 fails"; exit 1; fi
  sleep 60
fi
echo "again on $(hostname) rank=$RANK of $WORLD_SIZE restart=$GOTRAIN_RESTART_COUNT"'
echo "srun exit $?"
`, "-N3")
		c.wait(job, 60*time.Second)
		o := readFile(t, out)
		if !strings.Contains(o, "rank 3 fails") || !strings.Contains(o, "srun exit 0") {
			t.Fatalf("job %s: want rank 3 to fail once and the job to succeed:\n%s", job, o)
		}
		for r := range 6 {
			want := fmt.Sprintf("[rank %d] again on node%d rank=%d of 6 restart=1", r, r/2+1, r)
			if !strings.Contains(o, want) {
				t.Errorf("job %s: no %q:\n%s", job, want, o)
			}
		}
		t.Logf("crash and restart on 3 nodes in %s", time.Since(t0).Round(10*time.Millisecond))
	})

	// SLURM_RESTART_COUNT (the job's requeues) starts the restart count
	// the workers see.
	t.Run("requeue", func(t *testing.T) {
		t0 := time.Now()
		job, out := c.sbatch(`#!/bin/bash
srun gotrain launch --nproc-per-node 1 --backend cpu -- sh -c 'echo "slurm=$SLURM_RESTART_COUNT gotrain=$GOTRAIN_RESTART_COUNT torch=$TORCHELASTIC_RESTART_COUNT"'
if [ -z "$SLURM_RESTART_COUNT" ]; then scontrol requeue "$SLURM_JOB_ID"; sleep 30; fi
`, "-N2", "--requeue", "--open-mode=append")
		pushed := false
		c.waitFor("the job's second run", 60*time.Second, func() bool {
			if strings.Contains(readFile(t, out), "slurm=1 ") {
				return true
			}
			// A requeued job waits for its begin time: bring it forward,
			// once. Not to "now": slurmd refuses a credential made in the
			// same second it revoked the first run's ("Job credential
			// revoked"), and the job would end instead of running again.
			if b, _ := c.client("squeue", "-h", "-j", job, "-o", "%T %r"); !pushed && strings.Contains(string(b), "BeginTime") {
				_, err := c.client("scontrol", "update", "jobid="+job, "StartTime=now+3")
				pushed = err == nil
			}
			return false
		})
		c.wait(job, 30*time.Second)
		o := readFile(t, out)
		for _, want := range []string{"[rank 0] slurm= gotrain=0 torch=0", "[rank 1] slurm= gotrain=0 torch=0",
			"[rank 0] slurm=1 gotrain=1 torch=1", "[rank 1] slurm=1 gotrain=1 torch=1"} {
			if !strings.Contains(o, want) {
				t.Errorf("job %s: no %q:\n%s", job, want, o)
			}
		}
		t.Logf("a job requeued once in %s", time.Since(t0).Round(10*time.Millisecond))
	})

	// --nnodes 2:3: node3's agent SIGKILLed, the job goes on with node1
	// and node2 and succeeds there.
	t.Run("agent killed under --nnodes MIN:MAX", func(t *testing.T) {
		t0 := time.Now()
		job, out := c.sbatch(`#!/bin/bash
srun --kill-on-bad-exit=0 gotrain launch --nnodes 2:3 --nproc-per-node 1 --backend cpu -- sh -c '
echo "start world=$WORLD_SIZE on $(hostname)"
if [ "$WORLD_SIZE" = 3 ]; then sleep 60; fi
sleep 1
echo "end world=$WORLD_SIZE on $(hostname)"'
echo "srun exit $?"
`, "-N3")
		c.waitFor("three ranks running", 30*time.Second, func() bool { return strings.Count(readFile(t, out), "start world=3") == 3 })
		agent := c.agentPid(2)
		if agent == 0 {
			t.Fatalf("no gotrain agent on node3:\n%s", readFile(t, out))
		}
		if err := syscall.Kill(agent, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		c.wait(job, 60*time.Second)
		o := readFile(t, out)
		for _, want := range []string{"end world=2 on node1", "end world=2 on node2"} {
			if !strings.Contains(o, want) {
				t.Errorf("job %s: no %q after node3's agent was killed:\n%s", job, want, o)
			}
		}
		if strings.Contains(o, "end world=3") || strings.Contains(o, "gotrain: job failed") {
			t.Errorf("job %s: the first generation was not cut short, or the job failed:\n%s", job, o)
		}
		t.Logf("node3's agent killed to the job done on two nodes in %s", time.Since(t0).Round(10*time.Millisecond))
	})

	// Workers that go on after SIGTERM: the grace period given (10 s) is cut
	// to fit in KillWait (5 s here), so gotrain SIGKILLs them and exits 143
	// before Slurm's SIGKILL would end it (137, no report).
	t.Run("scancel with grace beyond KillWait", func(t *testing.T) {
		job, out := c.sbatch(`#!/bin/bash
srun -N2 gotrain launch --grace-period 10s --backend cpu --nproc-per-node 1 -- sh -c 'trap "echo got TERM" TERM; echo running; while :; do sleep 0.2; done'
`, "-N2")
		c.waitFor("both ranks running", 30*time.Second, func() bool { return strings.Count(readFile(t, out), "running") >= 2 })
		t0 := time.Now()
		if b, err := c.client("scancel", job); err != nil {
			t.Fatalf("scancel: %v: %s", err, b)
		}
		c.wait(job, 30*time.Second)
		o := readFile(t, out)
		if !strings.Contains(o, "[rank 0] got TERM") || !strings.Contains(o, "does not fit in the cluster's KillWait (5s, slurm.conf): using 3s") {
			t.Errorf("job %s: want the workers to get SIGTERM and a warning that the grace period was cut to 3s:\n%s", job, o)
		}
		if n := strings.Count(o, "Exited with exit code 143"); n != 2 || strings.Contains(o, "Killed") {
			t.Errorf("job %s: want both tasks to exit 143 before Slurm's SIGKILL:\n%s", job, o)
		}
		t.Logf("scancel of workers that ignore SIGTERM: job gone in %s", time.Since(t0).Round(10*time.Millisecond))
	})

	t.Run("scancel", func(t *testing.T) {
		job, out := c.sbatch(`#!/bin/bash
srun -N2 gotrain launch --backend cpu --nproc-per-node 1 -- sh -c 'trap "echo got USR1" USR1; echo running; while :; do sleep 0.2; done'
echo "srun exit $?"
`, "-N2")
		c.waitFor("both ranks running", 30*time.Second, func() bool { return strings.Count(readFile(t, out), "running") >= 2 })
		if b, err := c.client("scancel", "--signal=USR1", job); err != nil {
			t.Fatalf("scancel --signal=USR1: %v: %s", err, b)
		}
		c.waitFor("USR1 at both ranks", 60*time.Second, func() bool {
			o := readFile(t, out)
			return strings.Contains(o, "[rank 0] got USR1") && strings.Contains(o, "[rank 1] got USR1")
		})
		t0 := time.Now()
		if b, err := c.client("scancel", job); err != nil {
			t.Fatalf("scancel: %v: %s", err, b)
		}
		c.wait(job, 30*time.Second)
		deadline := time.Now().Add(30 * time.Second)
		for len(c.leftOver()) > 0 && time.Now().Before(deadline) {
			time.Sleep(100 * time.Millisecond)
		}
		if left := c.leftOver(); len(left) > 0 {
			t.Fatalf("after scancel of job %s, processes left:\n%s\noutput:\n%s", job, strings.Join(left, "\n"), readFile(t, out))
		}
		o := readFile(t, out)
		if n := strings.Count(o, "Exited with exit code 143"); n != 2 || strings.Contains(o, "with exit code 1\n") {
			t.Errorf("want both tasks to exit 143 (stopped by SIGTERM):\n%s", o)
		}
		// Counted once the job is over, not after a pause: a second
		// delivery of USR1, however late, came before the ranks ended.
		for _, r := range []string{"[rank 0] got USR1", "[rank 1] got USR1"} {
			if n := strings.Count(o, r); n != 1 {
				t.Errorf("%q %d times, want once:\n%s", r, n, o)
			}
		}
		t.Logf("scancel to nothing left in %s", time.Since(t0).Round(10*time.Millisecond))
	})
}
