package clustertest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gotrain/gotrain/internal/testing/testkit"
	"github.com/gotrain/gotrain/internal/testing/vcluster"
)

// quota is a cgroup that holds its processes to a share of one CPU.
type quota struct{ dir, name string }

// lift lets the cgroup's processes run at full speed again: the node was
// slow while it proved itself, and need not be slow to join (at 2% of a
// CPU, a TLS handshake outlasts the dial's deadline again and again).
func (q quota) lift(t *testing.T) {
	t.Helper()
	file, val := "cpu.cfs_quota_us", "-1"
	if _, err := os.Stat(filepath.Join(q.dir, file)); err != nil {
		file, val = "cpu.max", "max 100000"
	}
	if err := os.WriteFile(filepath.Join(q.dir, file), []byte(val), 0); err != nil {
		t.Fatalf("lift the quota of %s: %v", q.dir, err)
	}
}

// wrap is args, started so that they run in the cgroup from their first
// instruction: a host's processes run in a mount namespace without
// /sys/fs/cgroup, so the test moves the shell in (move) and the shell
// waits until it is there before it execs args.
func (q quota) wrap(args []string) []string {
	return append([]string{"sh", "-c", `until grep -q "/$0\$" /proc/self/cgroup; do sleep 0.05; done; exec "$@"`, q.name}, args...)
}

// move puts pid (a process wrap started) into the cgroup.
func (q quota) move(t *testing.T, pid int) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(q.dir, "cgroup.procs"), []byte(fmt.Sprint(pid)), 0); err != nil {
		t.Fatalf("move pid %d into %s: %v", pid, q.dir, err)
	}
}

// cpuQuota makes a cgroup (v1 cpu controller, or v2) that holds its
// processes to pct percent of one CPU. It skips the test where no cgroup
// can be made (outside CI). Made before the cluster, it is removed after
// the cluster's processes are gone.
func cpuQuota(t *testing.T, pct int) quota {
	t.Helper()
	name := fmt.Sprintf("gtpf%d-%s", os.Getpid(), strings.ReplaceAll(t.Name(), "/", "-"))
	var dir string
	var limit func() error
	if st, err := os.Stat("/sys/fs/cgroup/cpu/cgroup.procs"); err == nil && !st.IsDir() {
		dir = filepath.Join("/sys/fs/cgroup/cpu", name)
		limit = func() error {
			if err := os.WriteFile(filepath.Join(dir, "cpu.cfs_period_us"), []byte("100000"), 0); err != nil {
				return err
			}
			return os.WriteFile(filepath.Join(dir, "cpu.cfs_quota_us"), []byte(fmt.Sprint(pct*1000)), 0)
		}
	} else {
		dir = filepath.Join("/sys/fs/cgroup", name)
		limit = func() error {
			return os.WriteFile(filepath.Join(dir, "cpu.max"), []byte(fmt.Sprintf("%d 100000", pct*1000)), 0)
		}
	}
	err := os.Mkdir(dir, 0o755)
	if err == nil {
		if err = limit(); err != nil {
			os.Remove(dir)
		}
	}
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("no CPU quota for the slowed node: %v", err)
		}
		t.Skipf("no CPU quota for the slowed node (needs a writable cgroup cpu controller): %v", err)
	}
	t.Cleanup(func() {
		// The processes are gone (the cluster's cleanup ran first); the
		// kernel may take a moment to empty the group.
		deadline := time.Now().Add(30 * time.Second)
		for os.Remove(dir) != nil && time.Now().Before(deadline) {
			time.Sleep(100 * time.Millisecond)
		}
	})
	return quota{dir: dir, name: name}
}

// preflightJob starts gotrain launch --preflight quick on every host of c,
// one CPU rank each, --nnodes nnodes; the hosts in slow run under wrap (a
// CPU quota). Each host has a state directory of its own (its health
// record). The program prints its rank and the world size. extra are more
// flags for every host (a flag given again overrides).
func preflightJob(t *testing.T, c *vcluster.Cluster, nnodes string, slow map[int]quota, extra ...string) []*vcluster.Proc {
	t.Helper()
	return preflightJobRunning(t, c, nnodes, slow, `echo "step rank=$RANK world=$WORLD_SIZE"`, extra...)
}

// preflightJobRunning is preflightJob with program as the ranks' shell
// command.
func preflightJobRunning(t *testing.T, c *vcluster.Cluster, nnodes string, slow map[int]quota, program string, extra ...string) []*vcluster.Proc {
	t.Helper()
	var agents []*vcluster.Proc
	var caHash string
	for i, h := range c.Hosts {
		args := []string{bin.gotrain, "launch", "--nproc-per-node", "1", "--backend", "cpu", "--node-addr", h.IP,
			"--preflight", "quick", "--max-restarts", "0", "--join-settle", "2s"}
		if i == 0 {
			args = append(args, "--nnodes", nnodes, "--coordinator-listen", "0.0.0.0:"+coordPort)
		} else {
			args = append(args, "--coordinator", c.Hosts[0].IP, "--ca-hash", caHash, "--node-rank", fmt.Sprint(i))
		}
		args = append(args, extra...)
		args = append(args, "--", "sh", "-c", program)
		q, slowed := slow[i]
		if slowed {
			args = q.wrap(args)
		}
		env := []string{"XDG_STATE_HOME=" + stateDir(t, h)}
		agents = append(agents, h.StartEnv(env, args...))
		if slowed {
			q.move(t, agents[i].Pid())
			p := agents[i]
			testkit.WaitFor(t, 2*time.Minute, p.Host.Name+"'s preflight verdict", func() bool {
				return strings.Contains(p.Stderr(), "gotrain: preflight") || isDone(p)
			})
			q.lift(t)
		}
		if i == 0 {
			testkit.WaitFor(t, 2*time.Minute, "node1's join line", func() bool {
				if m := caHashFlag.FindStringSubmatch(agents[0].Stderr()); m != nil {
					caHash = m[1]
					return true
				}
				select {
				case <-agents[0].Done():
					t.Fatalf("node1's agent exited before printing the join line\n%s", c.Dump())
				default:
				}
				return false
			})
		}
	}
	return agents
}

var preflightFailLine = regexp.MustCompile(`gotrain: preflight: node node2 failed cpu-allreduce-\w+: measured [<>]? ?[0-9.e+]+ (MB/s|ms)( \([^)]*\))?, expected at (least|most) [0-9.]+ (MB/s|ms); fix: `)

// TestPreflightSlowNodeFixed: a node held to 2% of a CPU fails the CPU
// backend's all-reduce gate; with a fixed --nnodes the job fails before any
// step, every node exits 4, and the lines name the node, the check and its
// figures.
func TestPreflightSlowNodeFixed(t *testing.T) {
	t.Parallel()
	q := cpuQuota(t, 2)
	c := newCluster(t, 2)
	agents := preflightJob(t, c, "2", map[int]quota{1: q})
	for _, p := range agents {
		code, err := p.Wait(3 * time.Minute)
		if err != nil || code != 4 {
			t.Fatalf("%s's agent: exit %d, %v; want 4 (a node failed preflight)\n%s", p.Host.Name, code, err, c.Dump())
		}
		if strings.Contains(p.Stdout(), "step rank=") {
			t.Errorf("%s: a rank ran although a node failed preflight:\n%s", p.Host.Name, p.Stdout())
		}
	}
	if !preflightFailLine.MatchString(agents[1].Stderr()) {
		t.Errorf("node2's stderr has no line naming it, the check and its figures:\n%s", agents[1].Stderr())
	}
	if want := "node node2 (" + c.Hosts[1].IP + ") failed its preflight checks, before any step"; !strings.Contains(agents[0].Stderr(), want) {
		t.Errorf("node1's stderr does not say %q:\n%s", want, agents[0].Stderr())
	}
	if !strings.Contains(agents[0].Stderr(), "gotrain: preflight (quick) passed on node1") {
		t.Errorf("node1 did not say it passed:\n%s", agents[0].Stderr())
	}
}

// TestPreflightSlowNodeElastic: under --nnodes 2:3 the slowed node stays
// out (exit 4, its line says the job starts without it), and the other two
// run the job as a world of 2.
func TestPreflightSlowNodeElastic(t *testing.T) {
	t.Parallel()
	q := cpuQuota(t, 2)
	c := newCluster(t, 3)
	// node2 (index 1) is the slow one, so that the line the regexp looks
	// for is the same as in the fixed test.
	agents := preflightJob(t, c, "2:3", map[int]quota{1: q})
	code, err := agents[1].Wait(3 * time.Minute)
	if err != nil || code != 4 {
		t.Fatalf("node2's agent: exit %d, %v; want 4\n%s", code, err, c.Dump())
	}
	if stderr := agents[1].Stderr(); !preflightFailLine.MatchString(stderr) || !strings.Contains(stderr, "the job (--nnodes 2:3) goes on without it") {
		t.Errorf("node2's line does not name it, its figures and that the job goes on:\n%s", stderr)
	}
	for _, i := range []int{0, 2} {
		p := agents[i]
		code, err := p.Wait(3 * time.Minute)
		if err != nil || code != 0 {
			t.Fatalf("%s's agent: exit %d, %v; want 0\n%s", p.Host.Name, code, err, c.Dump())
		}
		if !strings.Contains(p.Stdout(), "world=2") {
			t.Errorf("%s's rank did not run in a world of 2:\n%s", p.Host.Name, p.Stdout())
		}
	}
	if strings.Contains(agents[1].Stdout(), "step rank=") {
		t.Errorf("node2 ran a rank:\n%s", agents[1].Stdout())
	}
	// node2's machine keeps the verdict, and doctor --history shows it.
	cmd := exec.Command(bin.gotrain, "doctor", "--history")
	cmd.Env = append(os.Environ(), "XDG_STATE_HOME="+stateDir(t, c.Hosts[1]))
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "preflight  cpu-allreduce-bandwidth") {
		t.Errorf("gotrain doctor --history on node2's state: %v\n%s", err, out)
	}
}

// stateDir is host h's state directory (its health record) in test t.
func stateDir(t *testing.T, h *vcluster.Host) string {
	t.Helper()
	stateDirs.Lock()
	defer stateDirs.Unlock()
	key := t.Name() + "/" + h.Name
	if d, ok := stateDirs.m[key]; ok {
		return d
	}
	d := filepath.Join(t.TempDir(), h.Name+"-state")
	stateDirs.m[key] = d
	return d
}

var stateDirs = struct {
	sync.Mutex
	m map[string]string
}{m: map[string]string{}}

func isDone(p *vcluster.Proc) bool {
	select {
	case <-p.Done():
		return true
	default:
		return false
	}
}
