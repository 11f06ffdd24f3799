// Package clustertest runs real gotrain agents on a virtual cluster of real
// hosts (internal/testing/vcluster: one network namespace, address and hostname per
// host) and injects faults into them: a 4-node MNIST job, a SIGKILLed agent,
// a partitioned node.
//
// The binaries are built once, in TestMain. Each test makes its own cluster
// (its own namespace prefix and subnet), so the tests run in parallel.
package clustertest

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gotrain/gotrain/internal/testing/testbin"
	"github.com/gotrain/gotrain/internal/testing/testkit"

	"github.com/gotrain/gotrain/internal/testing/vcluster"
)

var bin struct{ gotrain, mnist, data string }

func TestMain(m *testing.M) {
	if os.Getenv(floodEnv) != "" { // this binary, started on a host as the flooder (flood_test.go)
		os.Exit(floodMain())
	}
	pkgs := []string{"./cmd/gotrain", "./examples/mnist"}
	testbin.Main(m, "gotrain-clustertest-", pkgs, func(_ string, built map[string]string) (err error) {
		bin.gotrain, bin.mnist = built[pkgs[0]], built[pkgs[1]]
		bin.data, err = testbin.MNISTData()
		return err
	})
}

const coordPort = "29400"

// job is one gotrain job on a cluster: one agent per host, node1's
// embedding the coordinator.
type job struct {
	c      *vcluster.Cluster
	agents []*vcluster.Proc
	logDir []string   // each node's --log-dir
	args   [][]string // each node's command line
	// lastStart is when the last agent was started.
	lastStart time.Time
}

// startJob makes a cluster of n hosts and starts gotrain launch on each,
// one CPU rank per node, with agentFlags, running program (after `--`).
func startJob(t *testing.T, n int, agentFlags []string, program ...string) *job {
	t.Helper()
	return startElasticJob(t, n, fmt.Sprint(n), agentFlags, program...)
}

// startElasticJob is startJob with node1 given --nnodes nnodes.
func startElasticJob(t *testing.T, n int, nnodes string, agentFlags []string, program ...string) *job {
	t.Helper()
	c := newCluster(t, n)
	return startJobOn(t, c, c.Hosts, nnodes, nil, nil, agentFlags, program...)
}

// newCluster makes a cluster of n hosts whose processes share a new job
// token.
func newCluster(t *testing.T, n int) *vcluster.Cluster {
	t.Helper()
	tok := make([]byte, 16)
	if _, err := rand.Read(tok); err != nil {
		t.Fatal(err)
	}
	return vcluster.New(t, n, vcluster.Options{Env: []string{"GOTRAIN_JOB_TOKEN=" + hex.EncodeToString(tok)}})
}

// startJobOn is startElasticJob on hosts of c (the first runs the
// coordinator, with firstFlags too); afterFirst, when not nil, runs once
// the first node printed its join line, before the others start.
func startJobOn(t *testing.T, c *vcluster.Cluster, hosts []*vcluster.Host, nnodes string, firstFlags []string, afterFirst func(), agentFlags []string, program ...string) *job {
	t.Helper()
	j := &job{c: c}
	first := hosts[0]
	var caHash string
	for i, h := range hosts {
		dir := filepath.Join(t.TempDir(), h.Name)
		j.logDir = append(j.logDir, dir)
		args := []string{bin.gotrain, "launch", "--nproc-per-node", "1", "--backend", "cpu", "--node-addr", h.IP, "--log-dir", dir}
		if i == 0 {
			args = append(append(args, "--nnodes", nnodes, "--coordinator-listen", "0.0.0.0:"+coordPort), firstFlags...)
		} else {
			// As a person would: the CA's hash from node1's join line.
			// --node-rank: the nodes join in any order; node K runs rank K-1.
			args = append(args, "--coordinator", first.IP, "--ca-hash", caHash, "--node-rank", fmt.Sprint(i)) // the default port
		}
		args = append(append(append(args, agentFlags...), "--"), program...)
		j.args = append(j.args, args)
		j.agents = append(j.agents, h.Start(args...))
		if i == 0 && len(hosts) > 1 {
			testkit.WaitFor(t, time.Minute, "node1's join line", func() bool {
				if m := caHashFlag.FindStringSubmatch(j.agents[0].Stderr()); m != nil {
					caHash = m[1]
					return true
				}
				select {
				case <-j.agents[0].Done():
					t.Fatalf("node1's agent exited before printing the join line\n%s", c.Dump())
				default:
				}
				return false
			})
			if afterFirst != nil {
				afterFirst()
			}
		}
	}
	j.lastStart = time.Now()
	t.Cleanup(func() { j.agentReplicasAgree(t) }) // replicated_test.go
	return j
}

// caHashFlag is the CA's hash in the join line node1 prints.
var caHashFlag = regexp.MustCompile(`--ca-hash (sha256:[0-9a-f]{64})`)

// logTime is the time of a log line of an agent started with --verbose
// (slog's text format, milliseconds).
var logTime = regexp.MustCompile(`(?m)^time=(\S+) level=\S+ msg="([^"]*)" host=(\S+)(.*)$`)

// logLine is one parsed log line.
type logLine struct {
	at        time.Time
	msg, host string
	rest      string
}

// logLines are p's log lines whose message is msg.
func logLines(p *vcluster.Proc, msg string) []logLine {
	var ls []logLine
	for _, m := range logTime.FindAllStringSubmatch(p.Stderr(), -1) {
		if m[2] != msg {
			continue
		}
		at, err := time.Parse(time.RFC3339Nano, m[1])
		if err != nil {
			continue
		}
		ls = append(ls, logLine{at: at, msg: m[2], host: m[3], rest: m[4]})
	}
	return ls
}

// running waits until every agent of j has started generation 0 and rank
// 0 has begun training, and returns how long after the last agent's start
// the last agent started its workers (the rendezvous), and how long after
// the last node joined the coordinator.
func (j *job) running(t *testing.T) (fromStart, fromLastJoin time.Duration) {
	t.Helper()
	var last time.Time
	testkit.WaitFor(t, time.Minute, "generation 0 on every node and training on rank 0", func() bool {
		for _, p := range j.agents {
			select {
			case <-p.Done():
				t.Fatalf("%s's agent exited before the job ran\n%s", p.Host.Name, j.c.Dump())
			default:
			}
		}
		last = time.Time{}
		for _, p := range j.agents {
			ls := logLines(p, "generation started")
			var own *logLine
			for i := range ls {
				if ls[i].host == p.Host.Name && strings.Contains(ls[i].rest, " node=") {
					own = &ls[i]
				}
			}
			if own == nil {
				return false
			}
			if own.at.After(last) {
				last = own.at
			}
		}
		return strings.Contains(j.agents[0].Stderr(), "[rank 0] mnist:")
	})
	var lastJoin time.Time
	for _, l := range logLines(j.agents[0], "node joined") {
		if l.at.After(lastJoin) {
			lastJoin = l.at
		}
	}
	return last.Sub(j.lastStart), last.Sub(lastJoin)
}

var mnistFinal = regexp.MustCompile(`(?m)^\[rank 0\] final test_accuracy=([0-9.]+) ranks_agree=(true|false)$`)

// TestMNISTFourNodes: 4 hosts, one agent and one CPU rank each, train MNIST
// to ranks_agree=true; each host joins under its own hostname and address,
// and the ranks follow their --node-rank (node K runs rank K-1).
func TestMNISTFourNodes(t *testing.T) {
	t.Parallel()
	j := startJob(t, 4, []string{"--verbose", "--max-restarts", "0"}, bin.mnist, "--data", bin.data, "--epochs", "1", "--limit", "8000")
	fromStart, fromJoin := j.running(t)
	t.Logf("TIMING 4-node rendezvous: %v from the last agent's start to every agent running its workers (%v from the last node's join)", fromStart.Round(time.Millisecond), fromJoin.Round(time.Millisecond))
	for _, p := range j.agents {
		if code, err := p.Wait(2 * time.Minute); err != nil || code != 0 {
			t.Fatalf("%s's agent: exit %d, %v\n%s", p.Host.Name, code, err, j.c.Dump())
		}
	}
	m := mnistFinal.FindStringSubmatch(j.agents[0].Stdout())
	if m == nil {
		t.Fatalf("no final line from rank 0 on node1\n%s", j.c.Dump())
	}
	if acc, _ := strconv.ParseFloat(m[1], 64); m[2] != "true" || acc < 0.8 {
		t.Errorf("test_accuracy=%s ranks_agree=%s, want ≥ 0.8 and true", m[1], m[2])
	}
	joined := j.agents[0].Stderr()
	for k, h := range j.c.Hosts {
		if want := fmt.Sprintf(" hostname=%s address=%s ", h.Name, h.IP); !strings.Contains(joined, want) {
			t.Errorf("the coordinator did not log a join with%s", want)
		}
		// Ranks follow --node-rank: node K's only rank is K-1, and
		// its --log-dir holds that rank's log.
		// LOGDIR/RUN_ID/attempt-N/rankK.log: each run has a directory of its own.
		if m, _ := filepath.Glob(filepath.Join(j.logDir[k], "*", "attempt-*", fmt.Sprintf("rank%d.log", k))); len(m) != 1 {
			files, _ := filepath.Glob(filepath.Join(j.logDir[k], "*", "*", "*"))
			t.Errorf("%s did not run rank %d (its log dir holds %v)", h.Name, k, files)
		}
	}
	if t.Failed() {
		t.Log(j.c.Dump())
	}
}

// lostReport matches an agent's report of a lost node: the node's id and
// hostname.
var lostReport = regexp.MustCompile(`gotrain: job failed: node (node-\d+) on (\S+) \(agent pid (\d+)\) was lost: (.*)`)

// TestSIGKILLedAgent: node3's agent is SIGKILLed mid-training; every other
// agent exits non-zero with a report naming node3 and the killed agent.
func TestSIGKILLedAgent(t *testing.T) {
	t.Parallel()
	j := startJob(t, 4, []string{"--verbose", "--grace-period", "2s"}, bin.mnist, "--data", bin.data, "--epochs", "20")
	j.running(t)
	victim := j.c.Hosts[2]
	pid := victim.Proc().Pid()
	killed := time.Now()
	victim.Kill()
	j.othersFail(t, victim, "after node3's agent was killed")
	for _, p := range j.agents {
		if p.Host == victim {
			continue
		}
		m := lostReport.FindStringSubmatch(p.Stderr())
		if m == nil || m[2] != victim.Name || m[3] != strconv.Itoa(pid) {
			t.Errorf("%s's agent does not report %s (agent pid %d) lost; report: %q", p.Host.Name, victim.Name, pid, m)
		}
	}
	if lost := logLines(j.agents[0], "node lost"); len(lost) > 0 {
		t.Logf("TIMING SIGKILL detection: the coordinator noticed %v after the SIGKILL; the last survivor exited %v after it",
			lost[0].at.Sub(killed).Round(time.Millisecond), lastEnd(j, victim).Sub(killed).Round(time.Millisecond))
	} else {
		t.Errorf("the coordinator logged no lost node")
	}
	if t.Failed() {
		t.Log(j.c.Dump())
	}
}

// TestPartitionedNode: node3 is cut off both ways for longer than the node
// timeout; the job ends (every agent exits non-zero) with a report naming
// node3, never a healthy node, and node3's agent stops its own workers and
// exits, saying it was cut off.
func TestPartitionedNode(t *testing.T) {
	t.Parallel()
	j := startJob(t, 4, []string{"--verbose", "--grace-period", "2s"}, bin.mnist, "--data", bin.data, "--epochs", "20")
	j.running(t)
	victim := j.c.Hosts[2]
	cut := time.Now()
	victim.Partition(vcluster.Both)
	j.othersFail(t, victim, "although node3 was cut off")
	for _, p := range j.agents {
		if p.Host == victim {
			continue
		}
		if m := lostReport.FindStringSubmatch(p.Stderr()); m == nil || m[2] != victim.Name {
			t.Errorf("%s's report does not name %s, the node cut off: %q; its last lines:\n%s", p.Host.Name, victim.Name, m, tail(p.Stderr(), 5))
		}
	}
	if lost := logLines(j.agents[0], "node lost"); len(lost) > 0 {
		t.Logf("TIMING partition detection: the coordinator declared a node lost %v after the cut; the last survivor exited %v after it",
			lost[0].at.Sub(cut).Round(time.Millisecond), lastEnd(j, victim).Sub(cut).Round(time.Millisecond))
		chaosLine(t, lost[0].at.Sub(cut), 0) // faults_test.go: the job ends, naming the node (no recovery)
	} else {
		t.Errorf("the coordinator logged no lost node\n%s", j.c.Dump())
	}
	// The cut-off node's own agent stops its workers and says why.
	code, err := victim.Proc().Wait(time.Minute)
	if err != nil || code == 0 || !strings.Contains(victim.Proc().Stderr(), "cut off") {
		t.Errorf("the cut-off node's agent: exit %d, %v; want it to stop, saying it was cut off:\n%s", code, err, tail(victim.Proc().Stderr(), 3))
	}
	t.Logf("TIMING the cut-off node's agent exited %d, %v after the cut: %s", code, victim.Proc().Ended.Sub(cut).Round(time.Millisecond), tail(victim.Proc().Stderr(), 1))
	if t.Failed() {
		t.Log(j.c.Dump())
	}
}

// othersFail waits for every agent but victim's and checks that each
// exited non-zero (why says after what).
func (j *job) othersFail(t *testing.T, victim *vcluster.Host, why string) {
	t.Helper()
	for _, p := range j.agents {
		if p.Host == victim {
			continue
		}
		code, err := p.Wait(time.Minute)
		if err != nil {
			t.Fatalf("%v\n%s", err, j.c.Dump())
		}
		if code == 0 {
			t.Errorf("%s's agent exited 0 %s", p.Host.Name, why)
		}
	}
}

// lastEnd is when the last agent but skip's ended.
func lastEnd(j *job, skip *vcluster.Host) time.Time {
	var last time.Time
	for _, p := range j.agents {
		if p.Host != skip && p.Ended.After(last) {
			last = p.Ended
		}
	}
	return last
}

// tail is the last n lines of s.
func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// generations returns the world sizes of the generations node1's agent
// started, in order (from its --verbose log).
func (j *job) generations() []int {
	var ws []int
	for _, l := range logLines(j.agents[0], "generation started") {
		if m := worldSize.FindStringSubmatch(l.rest); m != nil && strings.Contains(l.rest, " node=") {
			n, _ := strconv.Atoi(m[1])
			ws = append(ws, n)
		}
	}
	return ws
}

var worldSize = regexp.MustCompile(` world_size=(\d+)`)

// TestBlip: node3 is cut off both ways for 2 s in the middle of training:
// nothing ends, nothing restarts, the job finishes with ranks that agree.
func TestBlip(t *testing.T) {
	t.Parallel()
	j := startJob(t, 4, []string{"--verbose", "--max-restarts", "0"}, bin.mnist, "--data", bin.data, "--epochs", "3", "--limit", "12000")
	j.running(t)
	victim := j.c.Hosts[2]
	healed := victim.Blip(2 * time.Second)
	for _, p := range j.agents {
		if code, err := p.Wait(3 * time.Minute); err != nil || code != 0 {
			t.Fatalf("%s's agent: exit %d, %v\n%s", p.Host.Name, code, err, j.c.Dump())
		}
	}
	select {
	case <-healed:
	default:
		t.Fatal("the job finished before the blip was over: train longer")
	}
	m := mnistFinal.FindStringSubmatch(j.agents[0].Stdout())
	if m == nil || m[2] != "true" {
		t.Errorf("rank 0's final line %q, want ranks_agree=true\n%s", m, j.c.Dump())
	}
	if gens := j.generations(); len(gens) != 1 {
		t.Errorf("generations %v; want one, the blip changing nothing", gens)
	}
	if !strings.Contains(j.agents[0].Stderr(), `msg="node unreachable"`) {
		t.Logf("the coordinator never found node3 unreachable during the 2 s blip (gossip and the stream rode it out)")
	}
}

// TestElasticShrinkAndGrow: with --nnodes 3:4, node3's agent is SIGKILLed
// mid-training: the job goes on on the 3 others (a new generation, world
// size 3, resuming from rank 0's checkpoint); node3's agent, started again,
// rejoins, and the job grows back to 4 and finishes with ranks that agree.
func TestElasticShrinkAndGrow(t *testing.T) {
	t.Parallel()
	ckpt := t.TempDir()
	j := startElasticJob(t, 4, "3:4", []string{"--verbose", "--grace-period", "2s", "--join-settle", "1s"},
		bin.mnist, "--data", bin.data, "--epochs", "8", "--limit", "6000", "--checkpoint-dir", ckpt)
	j.running(t)
	victim := j.c.Hosts[2]
	killed := time.Now()
	victim.Kill()
	testkit.WaitFor(t, time.Minute, "a generation on 3 nodes", func() bool { g := j.generations(); return len(g) >= 2 && g[len(g)-1] == 3 })
	restarted := time.Now()
	again := victim.Start(j.args[2]...)
	testkit.WaitFor(t, time.Minute, "the job grown back to 4 nodes", func() bool { g := j.generations(); return len(g) >= 3 && g[len(g)-1] == 4 })
	for _, p := range []*vcluster.Proc{j.agents[0], j.agents[1], again, j.agents[3]} {
		if code, err := p.Wait(3 * time.Minute); err != nil || code != 0 {
			t.Fatalf("%s's agent: exit %d, %v\n%s", p.Host.Name, code, err, j.c.Dump())
		}
	}
	if gens := j.generations(); gens[0] != 4 {
		t.Errorf("generations' world sizes %v; want 4, then 3, then 4", gens)
	}
	m := mnistFinal.FindStringSubmatch(j.agents[0].Stdout())
	if m == nil || m[2] != "true" {
		t.Errorf("rank 0's final line %q, want ranks_agree=true\n%s", m, j.c.Dump())
	}
	t.Logf("generations' world sizes: %v", j.generations())
	t.Logf("TIMING elastic recovery: node1 started the 3-node generation %v after the SIGKILL; the 4-node one %v after the agent was started again",
		j.generationAfter(3, killed).Sub(killed).Round(time.Millisecond), j.generationAfter(4, restarted).Sub(restarted).Round(time.Millisecond))
	chaosLine(t, since(killed, j.generationAfter(3, killed)), since(restarted, j.generationAfter(4, restarted))) // faults_test.go
}

// generationAfter is when node1's agent started the first generation of
// world size ws after t (from its --verbose log).
func (j *job) generationAfter(ws int, t time.Time) time.Time {
	for _, l := range logLines(j.agents[0], "generation started") {
		if m := worldSize.FindStringSubmatch(l.rest); m != nil && m[1] == strconv.Itoa(ws) && strings.Contains(l.rest, " node=") && l.at.After(t.Truncate(time.Millisecond)) {
			return l.at
		}
	}
	return time.Time{}
}
