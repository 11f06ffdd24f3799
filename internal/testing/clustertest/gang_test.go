package clustertest

import (
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

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
