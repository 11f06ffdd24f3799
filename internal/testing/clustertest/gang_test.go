package clustertest

import (
	"os"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gotrain/gotrain/internal/testing/testkit"
	"github.com/gotrain/gotrain/internal/testing/vcluster"
)

// slowLink holds what h sends to rate (a token bucket, tc tbf, on its
// eth0): a node whose own checks pass, with a degraded link that would
// hold every step back. (tbf rather than netem: netem is a module that
// machines here lack.)
func slowLink(t *testing.T, h *vcluster.Host, rate string) {
	t.Helper()
	if out, err := h.Exec("tc", "qdisc", "add", "dev", "eth0", "root", "tbf", "rate", rate, "burst", "16kb", "latency", "500ms"); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("no tc tbf in %s's namespace: %v\n%s", h.Name, err, out)
		}
		t.Skipf("no tc tbf in %s's namespace (needs the sch_tbf module): %v\n%s", h.Name, err, out)
	}
}

var gangFailLine = regexp.MustCompile(`gotrain: preflight: node node3 failed gang-(allreduce|allreduce-latency|join)( on link to node1)?: measured [^;]+(, expected [^;]+)?; fix: [^;]+; the job does not start`)

// TestPreflightGangSlowLink: three nodes pass their own checks, but node3's
// link is slow; the gang check names node3, and with a fixed --nnodes the
// job fails before any step: every node exits 4.
func TestPreflightGangSlowLink(t *testing.T) {
	t.Parallel()
	c := newCluster(t, 3)
	slowLink(t, c.Hosts[2], "1mbit")
	agents := preflightJob(t, c, "3", nil)
	for _, p := range agents {
		code, err := p.Wait(3 * time.Minute)
		if err != nil || code != 4 {
			t.Fatalf("%s's agent: exit %d, %v; want 4 (a node failed the gang check)\n%s", p.Host.Name, code, err, c.Dump())
		}
		if strings.Contains(p.Stdout(), "step rank=") {
			t.Errorf("%s: a rank ran although a node failed the gang check:\n%s", p.Host.Name, p.Stdout())
		}
		if !strings.Contains(p.Stderr(), "gotrain: preflight (quick) passed on "+p.Host.Name) {
			t.Errorf("%s did not pass its own checks first:\n%s", p.Host.Name, p.Stderr())
		}
	}
	t.Logf("node1's stderr:\n%s", agents[0].Stderr())
	for _, i := range []int{0, 1} {
		if stderr := agents[i].Stderr(); !gangFailLine.MatchString(stderr) || !strings.Contains(stderr, "the preflight gang check failed on node3") {
			t.Errorf("%s's stderr does not name node3, the check and its figures:\n%s", agents[i].Host.Name, stderr)
		}
	}
}

// TestPreflightGangHealthy: the gang check of healthy nodes passes, says
// so with its figures, and the job runs.
func TestPreflightGangHealthy(t *testing.T) {
	t.Parallel()
	c := newCluster(t, 2)
	agents := preflightJob(t, c, "2", nil)
	for _, p := range agents {
		code, err := p.Wait(3 * time.Minute)
		if err != nil || code != 0 {
			t.Fatalf("%s's agent: exit %d, %v; want 0\n%s", p.Host.Name, code, err, c.Dump())
		}
		if !strings.Contains(p.Stderr(), "gotrain: preflight (quick): the gang check of 2 nodes passed in ") || !strings.Contains(p.Stdout(), "world=2") {
			t.Errorf("%s: no gang line, or its rank did not run:\n%s\n%s", p.Host.Name, p.Stderr(), p.Stdout())
		}
	}
}

// TestPreflightGangSlowLinkElastic: under --nnodes 2:3 the node the gang
// check names stays out (exit 4), and the other two run the job as a world
// of 2. The first generation was already made with it, so its loss costs
// one restart (--max-restarts 1).
func TestPreflightGangSlowLinkElastic(t *testing.T) {
	t.Parallel()
	c := newCluster(t, 3)
	slowLink(t, c.Hosts[2], "1mbit")
	agents := preflightJob(t, c, "2:3", nil, "--max-restarts", "1")
	code, err := agents[2].Wait(3 * time.Minute)
	if err != nil || code != 4 {
		t.Fatalf("node3's agent: exit %d, %v; want 4\n%s", code, err, c.Dump())
	}
	if stderr := agents[2].Stderr(); !strings.Contains(stderr, "failed the preflight gang check and stays out of the job") {
		t.Errorf("node3 does not say it stays out:\n%s", stderr)
	}
	for _, i := range []int{0, 1} {
		p := agents[i]
		code, err := p.Wait(3 * time.Minute)
		if err != nil || code != 0 {
			t.Fatalf("%s's agent: exit %d, %v; want 0\n%s", p.Host.Name, code, err, c.Dump())
		}
		if !strings.Contains(p.Stdout(), "world=2") || !strings.Contains(p.Stderr(), "the job goes on without node3") {
			t.Errorf("%s: its rank did not run in a world of 2, or it did not say the job goes on without node3:\n%s\n%s", p.Host.Name, p.Stdout(), p.Stderr())
		}
	}
	if strings.Contains(agents[2].Stdout(), "step rank=") {
		t.Errorf("node3 ran a rank:\n%s", agents[2].Stdout())
	}
}

// TestPreflightGangLedgerCoolOff: the coordinator keeps the gang check's
// verdicts against a machine. Under --nnodes 2:3, node3 (a degraded link)
// is named by the gang check when the job starts, and again when it joins
// the running job back (the generation it grows is checked too); the third
// time it tries, the coordinator refuses it in one line naming the
// machine, the two verdicts and when it may come back, and its agent
// exits 4. The others run on throughout.
func TestPreflightGangLedgerCoolOff(t *testing.T) {
	t.Parallel()
	c := newCluster(t, 3)
	slowLink(t, c.Hosts[2], "1mbit")
	program := `echo "step rank=$RANK world=$WORLD_SIZE"; exec sleep 600`
	agents := preflightJobRunning(t, c, "2:3", nil, program, "--max-restarts", "5")
	m := caHashFlag.FindStringSubmatch(agents[0].Stderr())
	if m == nil {
		t.Fatalf("no --ca-hash in node1's join line:\n%s", agents[0].Stderr())
	}
	again := func() *vcluster.Proc {
		h := c.Hosts[2]
		return h.StartEnv([]string{"XDG_STATE_HOME=" + stateDir(t, h)}, bin.gotrain, "launch", "--nproc-per-node", "1", "--backend", "cpu",
			"--node-addr", h.IP, "--preflight", "quick", "--max-restarts", "5", "--coordinator", c.Hosts[0].IP, "--ca-hash", m[1],
			"--", "sh", "-c", program)
	}
	node3 := agents[2]
	for try := 1; try <= 2; try++ {
		code, err := node3.Wait(3 * time.Minute)
		if err != nil || code != 4 || !strings.Contains(node3.Stderr(), "failed the preflight gang check and stays out of the job") {
			t.Fatalf("node3's agent, try %d: exit %d, %v; want 4 after the gang check named it\n%s", try, code, err, c.Dump())
		}
		// It is out of the job before it tries again: the others run a
		// world of 2 (the line is the last rank's start).
		testkit.WaitFor(t, 3*time.Minute, "the job to run on node1 and node2 alone", func() bool {
			return strings.Count(agents[0].Stdout(), "world=2") >= try && strings.Count(agents[1].Stdout(), "world=2") >= try
		})
		node3 = again()
	}
	code, err := node3.Wait(3 * time.Minute)
	stderr := node3.Stderr()
	refused := regexp.MustCompile(`gotrain: machine is cooling off: machine node3 failed 2 times within 24h0m0s in this job \(preflight gang-allreduce(-latency)? at [0-9TZ:-]+; preflight gang-allreduce(-latency)? at [0-9TZ:-]+\); it may join again from [0-9TZ:-]+ \(--nnodes MIN:MAX goes on without it\) \(exit status 4\)`)
	if err != nil || code != 4 || !refused.MatchString(stderr) {
		t.Fatalf("node3's third try: exit %d, %v; want 4 with the coordinator's line on its two verdicts\n%s\n%s", code, err, stderr, c.Dump())
	}
	for _, p := range agents[:2] {
		if isDone(p) {
			t.Fatalf("%s's agent exited while node3 came and went\n%s", p.Host.Name, c.Dump())
		}
		_ = p.Signal(syscall.SIGTERM)
	}
	for _, p := range agents[:2] {
		if _, err := p.Wait(2 * time.Minute); err != nil {
			t.Errorf("%s's agent did not stop: %v", p.Host.Name, err)
		}
	}
}
