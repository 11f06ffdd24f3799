package integration

import (
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// memsnap_peer_torch.py's lines (the agent prefixes "[rank R] ").
var (
	peerSaved   = regexp.MustCompile(`(?m)^\[rank (\d+)\] saved step (\d+) state ([0-9a-f]{64})$`)
	peerWaiting = regexp.MustCompile(`(?m)^\[rank 1\] waiting at step (\d+) for the node to be killed: pid (\d+)$`)
	peerResumed = regexp.MustCompile(`(?m)^\[rank (\d+)\] resumed at step (\d+) of world (\d+) state ([0-9a-f]{64})$`)
	peerWeights = regexp.MustCompile(`(?m)^\[rank (\d+)\] weights ([0-9a-f]{64})$`)
)

// threeTorchNodes starts three loopback agents of one CPU rank each under
// --nnodes 2:3 running memsnap_peer_torch.py with progArgs; the first
// embeds the coordinator, so it is group rank 0 (rank 0).
func threeTorchNodes(t *testing.T, progArgs ...string) []*job {
	t.Helper()
	script := testdata(t, "memsnap_peer_torch.py")
	dir := t.TempDir()
	flags := []string{"launch", "--nproc-per-node", "1", "--backend", "cpu", "--node-addr", "127.0.0.1",
		"--standby", "off", "--max-restarts", "5", "--grace-period", "3s", "--verbose"}
	prog := append([]string{"--", "python3", script}, progArgs...)
	// A long --join-settle: the first generation waits for all three.
	first := startTorchJob(t, dir, slices.Concat(flags, []string{"--nnodes", "2:3", "--coordinator-listen", "127.0.0.1:0", "--join-settle", "2m"}, prog)...)
	join := joinArgs(t, first)
	js := []*job{first}
	for range 2 {
		js = append(js, startTorchJob(t, dir, slices.Concat(flags, join, prog)...))
	}
	return js
}

func stdouts(js []*job) string {
	var b strings.Builder
	for _, j := range js {
		b.WriteString(j.out.String())
	}
	return b.String()
}

// With real PyTorch (gloo) and the gotrain_snapshot module, across
// a lost node: three nodes of one rank each; rank 1 waits at step 12 once
// its snapshot is handed over (so replicated to its ring neighbour); then
// its node is SIGKILLed, agent and worker. The job goes on on the two
// others, where the third node now runs rank 1: it holds no snapshot of its
// own of rank 1, only the replica the lost node's agent sent it, and
// restores from it the bytes rank 1 saved (the state's hash) at step 12: no
// step is lost. The program's reduction does not depend on the world size,
// so every rank's final parameters and momentum are bit-identical to those
// of the same job without the fault.
func TestTorchNodeLostRankRestoresFromPeer(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("runs two PyTorch jobs of three nodes")
	}
	needTorch(t)

	clean := threeTorchNodes(t)
	for i, code := range exits(t, 5*time.Minute, clean...) {
		if code != 0 {
			t.Fatalf("the run without a fault: node %d exited %d\n%s", i+1, code, dump(clean...))
		}
	}
	out := stdouts(clean)
	want := peerWeights.FindAllStringSubmatch(out, -1)
	if len(want) != 3 || peerResumed.MatchString(out) {
		t.Fatalf("the run without a fault: want 3 weights lines and no resume:\n%s", dump(clean...))
	}
	for _, w := range want[1:] {
		if w[2] != want[0][2] {
			t.Fatalf("the run without a fault: the ranks' weights differ:\n%s", out)
		}
	}

	js := threeTorchNodes(t, "--hang")
	victim := -1
	var pid int
	waitLong(t, js, "rank 1 waiting at step 12 and every rank's step 12 saved", func() bool {
		out := stdouts(js)
		if len(peerSaved.FindAllString(out, -1)) < 3 {
			return false
		}
		for i, j := range js {
			if m := peerWaiting.FindStringSubmatch(j.out.String()); m != nil {
				victim, pid = i, atoi(t, m[2])
				return true
			}
		}
		return false
	})
	if victim == 0 {
		t.Fatalf("rank 1 runs on the coordinator's node:\n%s", dump(js...))
	}
	saved := map[string]string{}
	for _, m := range peerSaved.FindAllStringSubmatch(stdouts(js), -1) {
		saved[m[1]] = m[3]
	}
	// The whole node dies: its agent, and the worker (PDEATHSIG would
	// kill it too).
	if err := js[victim].cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = syscall.Kill(pid, syscall.SIGKILL)
	survivors := []*job{js[0], js[3-victim]}
	for _, j := range survivors {
		if code := j.wait(t, 5*time.Minute); code != 0 {
			t.Fatalf("a surviving node exited %d\n%s", code, dump(js...))
		}
	}
	out = stdouts(survivors)

	// The last generation's resumes (earlier restarts may have run with
	// the lost node still counted): world 2, both at step 12, each with the
	// state its rank saved; rank 1's is on the node that holds the replica.
	last := map[string][]string{}
	for _, m := range peerResumed.FindAllStringSubmatch(out, -1) {
		if m[3] == "2" {
			last[m[1]] = m
		}
	}
	for _, r := range []string{"0", "1"} {
		m := last[r]
		if m == nil || m[2] != "12" {
			t.Errorf("rank %s did not resume at step 12 in the world of 2: %q\n%s", r, m, dump(js...))
			continue
		}
		if m[4] != saved[r] {
			t.Errorf("rank %s resumed with state %s, but saved %s at step 12", r, m[4], saved[r])
		}
	}
	if m := last["1"]; m != nil && !strings.Contains(survivors[1].out.String(), m[0]) {
		t.Errorf("rank 1 did not resume on the node that was rank 2 (the lost node's ring neighbour):\n%s", dump(js...))
	}
	if o := survivors[1].out.String() + survivors[1].err.String(); !strings.Contains(o, "gotrain.snapshot: rank 1 restored the state of step 12 from a peer node's replica") {
		t.Errorf("rank 1's restore does not say it found step 12 in a peer node's replica:\n%s", o)
	}
	if !strings.Contains(survivors[1].err.String(), "a rank restores from the replica a peer node sent here") {
		t.Errorf("the ring neighbour's agent does not say it served rank 1 from the lost node's replica:\n%s", survivors[1].err.String())
	}
	t.Logf("after the fault:\n%s", strings.Join(append(peerResumed.FindAllString(out, -1), peerWeights.FindAllString(out, -1)...), "\n"))
	got := peerWeights.FindAllStringSubmatch(out, -1)
	if len(got) != 2 {
		t.Fatalf("want the weights of 2 ranks after the fault, got %q\n%s", got, dump(js...))
	}
	for _, g := range got {
		if g[2] != want[0][2] {
			t.Errorf("rank %s's weights %s after the fault, want %s as without it", g[1], g[2], want[0][2])
		}
	}
}

// waitLong waits up to 5 minutes for cond, failing if a job exits first.
func waitLong(t *testing.T, js []*job, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Minute)
	for !cond() {
		for _, j := range js {
			select {
			case <-j.done:
				if !cond() {
					t.Fatalf("a node exited (%v) before %s\n%s", j.cmd.ProcessState, what, dump(js...))
				}
				return
			default:
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %s within 5m\n%s", what, dump(js...))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func atoi(t *testing.T, s string) int {
	t.Helper()
	n, err := strconv.Atoi(s)
	if err != nil {
		t.Fatal(err)
	}
	return n
}
