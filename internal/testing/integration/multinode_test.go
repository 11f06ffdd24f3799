package integration

import (
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

// Multi-node jobs on one machine: every agent is its own `gotrain launch`
// process with --node-addr 127.0.0.1, and they meet at a coordinator over
// loopback, as nodes of a cluster would.

// joinCommand is the part of the line that the first node (or `gotrain
// coordinator`) prints for the others: the address, the CA's hash, and the
// file that holds the token (it is never printed).
var joinCommand = regexp.MustCompile(`--coordinator (\S+) --ca-hash (sha256:[0-9a-f]{64}) .*GOTRAIN_JOB_TOKEN=\$\(cat (\S+)\)`)

// rankEnv matches testprog env's output: [rank R] NAME=VALUE.
var rankEnv = regexp.MustCompile(`(?m)^\[rank (\d+)\] ([A-Z_]+)=(.*)$`)

// startAgent starts one node's agent with 2 CPU ranks.
func startAgent(t *testing.T, args ...string) *job {
	t.Helper()
	return startJob(t, append([]string{"launch", "--nproc-per-node", "2", "--backend", "cpu", "--node-addr", "127.0.0.1"}, args...)...)
}

// joinArgs waits for j to print how other nodes join and returns those
// flags, with the token read from the file the line names (a test may pass
// it in argv; people set GOTRAIN_JOB_TOKEN).
func joinArgs(t *testing.T, j *job) []string {
	t.Helper()
	var m []string
	waitOutput(t, j, "the join command", func() bool {
		m = joinCommand.FindStringSubmatch(j.err.String())
		return m != nil
	})
	tok, err := os.ReadFile(m[3])
	if err != nil {
		t.Fatalf("the join line names the token file %s: %v", m[3], err)
	}
	if strings.Contains(j.err.String(), strings.TrimSpace(string(tok))) {
		t.Errorf("the job token appears in the output:\n%s", j.err.String())
	}
	return []string{"--coordinator", m[1], "--job-token", strings.TrimSpace(string(tok)), "--ca-hash", m[2]}
}

// waitOutput waits until cond holds, failing if j exits first or after a
// minute.
func waitOutput(t *testing.T, j *job, what string, cond func() bool) {
	t.Helper()
	defer func() {
		if !cond() { // waitUntil failed the test
			t.Logf("stderr:\n%s", j.err.String())
		}
	}()
	testkit.WaitFor(t, time.Minute, what, func() bool {
		select {
		case <-j.done:
			if !cond() {
				t.Fatalf("gotrain exited (%v) before %s\nstdout:\n%s\nstderr:\n%s", j.cmd.ProcessState, what, j.out.String(), j.err.String())
			}
			return true
		default:
			return cond()
		}
	})
}

// twoNodes starts a job of two agents with 2 ranks each: the first embeds
// the coordinator, or, with standalone, both join a `gotrain coordinator`
// (returned, else nil). The first agent joins first, so it is group rank 0.
func twoNodes(t *testing.T, standalone bool, args ...string) (first, second, coord *job) {
	t.Helper()
	prog := slices.Index(args, "--")
	flags, program := args[:prog], args[prog:]
	if standalone {
		coord = startJob(t, append([]string{"coordinator", "--nnodes", "2", "--listen", "127.0.0.1:0"}, coordFlags(flags)...)...)
		join := joinArgs(t, coord)
		first = startAgent(t, slices.Concat(flags, join, program)...)
		waitOutput(t, coord, "the first node's join", func() bool { return strings.Contains(coord.err.String(), "node_id=node-1") })
		second = startAgent(t, slices.Concat(flags, join, program)...)
		return first, second, coord
	}
	first = startAgent(t, slices.Concat([]string{"--nnodes", "2", "--coordinator-listen", "127.0.0.1:0"}, flags, program)...)
	second = startAgent(t, slices.Concat(flags, joinArgs(t, first), program)...)
	return first, second, nil
}

// coordFlags are the agent flags that `gotrain coordinator` takes too.
func coordFlags(flags []string) []string {
	var out []string
	for i := 0; i+1 < len(flags); i += 2 {
		if flags[i] == "--max-restarts" || flags[i] == "--rendezvous-timeout" || flags[i] == "--run-id" {
			out = append(out, flags[i], flags[i+1])
		}
	}
	return out
}

// exits waits for every job and returns their exit statuses.
func exits(t *testing.T, d time.Duration, js ...*job) []int {
	t.Helper()
	codes := make([]int, len(js))
	for i, j := range js {
		codes[i] = j.wait(t, d)
	}
	return codes
}

func dump(js ...*job) string {
	var b strings.Builder
	for i, j := range js {
		fmt.Fprintf(&b, "--- process %d (%v) stdout:\n%s--- stderr:\n%s", i, j.cmd.Args[1:3], j.out.String(), j.err.String())
	}
	return b.String()
}

func TestMultiNodeJob(t *testing.T) {
	t.Parallel()
	for _, standalone := range []bool{false, true} {
		name := "embedded"
		if standalone {
			name = "standalone"
		}
		t.Run(name+"/env", func(t *testing.T) {
			t.Parallel()
			a, b, c := twoNodes(t, standalone, "--run-id", "multi", "--", bin.testprog, "env")
			js := []*job{a, b}
			if c != nil {
				js = append(js, c)
			}
			for i, code := range exits(t, time.Minute, js...) {
				if code != 0 {
					t.Fatalf("process %d exited %d\n%s", i, code, dump(js...))
				}
			}
			env := map[int]map[string]string{}
			for node, j := range []*job{a, b} {
				for _, m := range rankEnv.FindAllStringSubmatch(j.out.String(), -1) {
					r, _ := strconv.Atoi(m[1])
					if env[r] == nil {
						env[r] = map[string]string{"node": strconv.Itoa(node)}
					}
					env[r][m[2]] = m[3]
				}
			}
			if len(env) != 4 {
				t.Fatalf("want ranks 0-3, got %d ranks\n%s", len(env), dump(js...))
			}
			for r := range 4 {
				e := env[r]
				// The first node joined first: group 0, ranks 0-1.
				node := r / 2
				for k, want := range map[string]string{
					"node": strconv.Itoa(node), "RANK": strconv.Itoa(r), "GOTRAIN_RANK": strconv.Itoa(r),
					"LOCAL_RANK": strconv.Itoa(r % 2), "GROUP_RANK": strconv.Itoa(node), "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2",
					"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": env[0]["MASTER_PORT"], "TORCHELASTIC_RUN_ID": "multi",
					"TORCHELASTIC_RESTART_COUNT": "0", "GOTRAIN_HOST": "127.0.0.1",
				} {
					if e[k] != want {
						t.Errorf("rank %d: %s=%q, want %q", r, k, e[k], want)
					}
				}
			}
			if p, err := strconv.Atoi(env[0]["MASTER_PORT"]); err != nil || p <= 0 {
				t.Errorf("MASTER_PORT=%q", env[0]["MASTER_PORT"])
			}
			if c != nil && !strings.Contains(c.err.String(), "job succeeded") {
				t.Errorf("the coordinator did not report success:\n%s", c.err.String())
			}
			// A node that joined another's coordinator says which job it joined.
			joined := regexp.MustCompile(`(?m)^gotrain: joined run multi: 4 ranks on 2 nodes; this node \(\S+\) runs ranks (\d-\d)$`)
			if m := joined.FindStringSubmatch(b.err.String()); m == nil || m[1] != "2-3" {
				t.Errorf("the second node does not say it joined run multi with ranks 2-3 (%v)\n%s", m, dump(js...))
			}
			if m := joined.FindStringSubmatch(a.err.String()); (m != nil) != standalone || standalone && m[1] != "0-1" {
				t.Errorf("the first node: joined line %v, want one only when it joined a standalone coordinator\n%s", m, dump(js...))
			}
		})
		t.Run(name+"/collectives", func(t *testing.T) {
			t.Parallel()
			a, b, c := twoNodes(t, standalone, "--", bin.testprog, "collectives", "--max", "65537")
			js := []*job{a, b}
			if c != nil {
				js = append(js, c)
			}
			for i, code := range exits(t, time.Minute, js...) {
				if code != 0 {
					t.Fatalf("process %d exited %d\n%s", i, code, dump(js...))
				}
			}
			for r := range 4 {
				j := []*job{a, b}[r/2]
				if !strings.Contains(j.out.String(), fmt.Sprintf("[rank %d] collectives ok: 112 all-reduces up to 65537 elements, world 4", r)) {
					t.Errorf("rank %d did not report success\n%s", r, dump(js...))
				}
			}
		})
	}
}

// TestMultiNodeFailure: a rank on the second node fails; both agents (and a
// standalone coordinator) exit with its status and name it and its host.
func TestMultiNodeFailure(t *testing.T) {
	t.Parallel()
	host, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	for _, standalone := range []bool{false, true} {
		t.Run(fmt.Sprintf("standalone=%t", standalone), func(t *testing.T) {
			t.Parallel()
			a, b, c := twoNodes(t, standalone, "--max-restarts", "0", "--grace-period", "2s", "--",
				bin.testprog, "exit", "--rank", "3", "--code", "3")
			js := []*job{a, b}
			if c != nil {
				js = append(js, c)
			}
			for i, code := range exits(t, time.Minute, js...) {
				if code != 3 {
					t.Errorf("process %d exited %d, want 3", i, code)
				}
			}
			for i, j := range []*job{a, b} {
				for _, want := range []string{"gotrain: job failed: rank 3 on " + host + " ", "exit status 3", "rank 3 exiting with 3 on purpose"} {
					if !strings.Contains(j.err.String(), want) {
						t.Errorf("agent %d's stderr lacks %q", i, want)
					}
				}
			}
			if c != nil && !strings.Contains(c.err.String(), "job failed: job failed in generation 0: rank 3 (pid ") {
				t.Errorf("the coordinator does not name the rank")
			}
			if t.Failed() {
				t.Log(dump(js...))
			}
			waitNoLeftovers(t, 10*time.Second)
		})
	}
}

// TestMultiNodeRestart: a rank on the second node dies in the first
// generation; both nodes start generation 1 and the job succeeds.
func TestMultiNodeRestart(t *testing.T) {
	t.Parallel()
	mark := filepath.Join(t.TempDir(), "mark")
	a, b, _ := twoNodes(t, false, "--max-restarts", "1", "--grace-period", "2s", "--",
		bin.testprog, "restart", "--mark", mark, "--victim", "3", "--delay", "10ms", "--size", "1000")
	for i, code := range exits(t, time.Minute, a, b) {
		if code != 0 {
			t.Fatalf("agent %d exited %d\n%s", i, code, dump(a, b))
		}
	}
	if !strings.Contains(b.err.String(), "[rank 3] rank 3 dies on purpose") {
		t.Errorf("rank 3 did not die\n%s", dump(a, b))
	}
	for r := range 4 {
		j := []*job{a, b}[r/2]
		if !regexp.MustCompile(fmt.Sprintf(`(?m)^\[rank %d\] RESTART rank=%d generation=1 `, r, r)).MatchString(j.out.String()) {
			t.Errorf("rank %d did not run generation 1\n%s", r, dump(a, b))
		}
	}
}

// TestMultiNodeLostNode: SIGKILL one agent mid-job. The other agent's job
// ends with a message naming what was lost (the second node and its host;
// the coordinator, which the first node embeds), and no process of either
// node is left: the killed agent's workers die by PDEATHSIG, their children
// by its reaper.
func TestMultiNodeLostNode(t *testing.T) {
	t.Parallel()
	host, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	for _, kill := range []string{"second", "first"} {
		t.Run("kill "+kill, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			a, b, _ := twoNodes(t, false, "--grace-period", "1s", "--max-restarts", "3", "--", bin.testprog, "sleep", "--pid-dir", dir)
			var pids []int
			waitOutput(t, a, "8 pid files (4 workers, 4 children)", func() bool {
				files, _ := filepath.Glob(filepath.Join(dir, "*.pid"))
				if len(files) < 8 {
					return false
				}
				pids = pids[:0]
				for _, f := range files {
					bs, err := os.ReadFile(f)
					if err != nil {
						t.Fatal(err)
					}
					pid, err := strconv.Atoi(string(bs))
					if err != nil {
						t.Fatal(err)
					}
					pids = append(pids, pid)
				}
				return true
			})
			killed, survivor := b, a
			wants := []string{
				"gotrain: job failed: node node-2 on " + host + " (agent pid " + strconv.Itoa(b.cmd.Process.Pid) + ") was lost: its agent disconnected",
				"node node-2 on " + host + " (127.0.0.1, agent pid", "ranks 2-3) was lost", "only 1 of the 2 nodes it needs remain",
			}
			if kill == "first" {
				killed, survivor = a, b
				wants = []string{"lost the coordinator at 127.0.0.1:", "workers on " + host + " were stopped"}
			}
			if err := killed.cmd.Process.Signal(syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			if code := survivor.wait(t, 30*time.Second); code == 0 {
				t.Errorf("the surviving agent exited 0")
			}
			for _, want := range wants {
				if !strings.Contains(survivor.err.String(), want) {
					t.Errorf("the surviving agent's stderr lacks %q", want)
				}
			}
			if t.Failed() {
				t.Log(dump(a, b))
			}
			waitGone(t, pids, 10*time.Second)
			waitNoLeftovers(t, 10*time.Second)
		})
	}
}

// TestMultiNodeWrongToken: a node with the wrong token is turned away with a
// clear message; the first node gives up after --rendezvous-timeout.
func TestMultiNodeWrongToken(t *testing.T) {
	t.Parallel()
	a := startAgent(t, "--nnodes", "2", "--coordinator-listen", "127.0.0.1:0", "--rendezvous-timeout", "3s", "--", bin.testprog, "env")
	join := joinArgs(t, a)
	b := startAgent(t, "--coordinator", join[1], "--job-token", "not-"+join[3], "--ca-hash", join[5], "--", bin.testprog, "env")
	if code := b.wait(t, 30*time.Second); code != 1 {
		t.Errorf("the node with the wrong token exited %d, want 1", code)
	}
	if !strings.Contains(b.err.String(), "wrong job token: set GOTRAIN_JOB_TOKEN") {
		t.Errorf("the node with the wrong token does not say so:\n%s", b.err.String())
	}
	if code := a.wait(t, 30*time.Second); code != 1 {
		t.Errorf("the first node exited %d, want 1", code)
	}
	if want := "1 of 2 nodes joined within the rendezvous timeout of 3s"; !strings.Contains(a.err.String(), want) {
		t.Errorf("the first node's stderr lacks %q", want)
	}
	if strings.Contains(a.out.String(), "[rank") {
		t.Errorf("workers ran although the job never started")
	}
	if t.Failed() {
		t.Log(dump(a, b))
	}
	waitNoLeftovers(t, 10*time.Second)
}

// A mistyped (well-formed) --ca-hash at first contact says the hash does
// not match the coordinator's certificate, names both, and how to get the
// right one: not that the coordinator restarted with a new identity, which
// it did not (this node never reached it before).
func TestMultiNodeWrongCAHash(t *testing.T) {
	t.Parallel()
	a := startAgent(t, "--nnodes", "2", "--coordinator-listen", "127.0.0.1:0", "--rendezvous-timeout", "3s", "--", bin.testprog, "env")
	join := joinArgs(t, a)
	wrong := "sha256:" + strings.Repeat("ab", 32)
	b := startAgent(t, "--coordinator", join[1], "--job-token", join[3], "--ca-hash", wrong, "--", bin.testprog, "env")
	if code := b.wait(t, 30*time.Second); code != 1 {
		t.Errorf("the node with the wrong --ca-hash exited %d, want 1", code)
	}
	out := b.err.String()
	for _, w := range []string{"--ca-hash " + wrong + " does not match the coordinator's certificate, whose CA hash is " + join[5], "copy --ca-hash from the first node's line", "leave --ca-hash out"} {
		if !strings.Contains(out, w) {
			t.Errorf("the node with the wrong --ca-hash does not say %q:\n%s", w, out)
		}
	}
	if strings.Contains(out, "new identity") || strings.Contains(out, "restart the job") {
		t.Errorf("a mistyped --ca-hash reads as a restarted coordinator:\n%s", out)
	}
	a.wait(t, 30*time.Second)
	if t.Failed() {
		t.Log(dump(a, b))
	}
	waitNoLeftovers(t, 10*time.Second)
}

// A coordinator that cannot be reached: the periodic waiting line says why
// (its name does not resolve, connection refused), one line per period.
func TestJoinWaitingSaysWhy(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refused := ln.Addr().String()
	ln.Close()
	for _, tc := range []struct{ addr, want string }{
		{refused, "waiting for the coordinator at " + refused + ": connection refused"},
		{"gotrain-no-such-host.invalid:29400", "waiting for the coordinator at gotrain-no-such-host.invalid:29400: its name does not resolve (DNS"},
	} {
		t.Run(tc.addr, func(t *testing.T) {
			t.Parallel()
			start := time.Now()
			a := startAgent(t, "--nnodes", "2", "--coordinator", tc.addr, "--job-token", "0123456789abcdef0123456789abcdef",
				"--ca-hash", "sha256:"+strings.Repeat("ab", 32), "--join-timeout", "5m", "--", "true")
			waitOutput(t, a, "a waiting line with its reason", func() bool { return strings.Contains(a.err.String(), tc.want) })
			if err := a.cmd.Process.Signal(syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
			a.wait(t, time.Minute)
			out := a.err.String()
			if waits := strings.Count(out, "gotrain: waiting for the coordinator at"); waits > 1+int(time.Since(start)/(10*time.Second)) {
				t.Errorf("%d waiting lines, want one per 10 s:\n%s", waits, out)
			}
		})
	}
}

// Every node on one host, each given --coordinator-listen 127.0.0.1:P (as
// people do): the first node says once, plainly, that the coordinator is
// not replicated and why; no node is asked to host a replica on the first
// one's own port ("address already in use"); the job runs.
func TestOneHostNotReplicated(t *testing.T) {
	t.Parallel()
	port, err := netport.Unclaimed("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	listen := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	a := startAgent(t, "--nnodes", "3", "--coordinator-listen", listen, "--", "true")
	join := joinArgs(t, a)
	b := startAgent(t, append(join, "--nnodes", "3", "--coordinator-listen", listen, "--", "true")...)
	c := startAgent(t, append(join, "--nnodes", "3", "--coordinator-listen", listen, "--", "true")...)
	for _, j := range []*job{a, b, c} {
		if code := j.wait(t, 2*time.Minute); code != 0 {
			t.Errorf("a node exited %d, want 0", code)
		}
	}
	if n := strings.Count(a.err.String(), "the coordinator is not replicated (the job's 3 nodes would have 3): it listens on "+listen+", a loopback address"); n != 1 {
		t.Errorf("the first node says %d times that the coordinator is not replicated, want once", n)
	}
	for _, j := range []*job{a, b, c} {
		if s := j.err.String(); strings.Contains(s, "host a replica") || strings.Contains(s, "address already in use") {
			t.Errorf("a node was asked to host a replica on one host:\n%s", s)
		}
	}
	if t.Failed() {
		t.Log(dump(a, b, c))
	}
}
