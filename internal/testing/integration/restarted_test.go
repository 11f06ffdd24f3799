package integration

import (
	"net"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gotrain/gotrain/internal/netport"
)

var caHashIn = regexp.MustCompile(`--ca-hash (sha256:[0-9a-f]{64})`)

// With real processes: a standalone `gotrain coordinator`
// SIGKILLed and started again has a new random CA (and none of the job's
// state). Its agent says so plainly — "restarted with a new identity",
// both hashes, "restart the job" — and exits non-zero at once: not a CA
// mismatch that sounds like an attack, not "the coordinator has lost this
// node" after the node timeout (2 minutes here).
func TestRestartedStandaloneCoordinator(t *testing.T) {
	t.Parallel()
	// Below the ephemeral range: a :0 port may be taken as some dial's
	// local port before the restarted coordinator binds it again.
	port, err := netport.Unclaimed("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	env := []string{"GOTRAIN_JOB_TOKEN=0123456789abcdef0123456789abcdef"}
	coordArgs := []string{"coordinator", "--nnodes", "1", "--listen", addr, "--node-timeout", "2m"}
	first := startEnv(t, env, coordArgs...)
	waitOutput(t, first, "the first coordinator's join line", func() bool { return caHashIn.MatchString(first.err.String()) })
	was := caHashIn.FindStringSubmatch(first.err.String())[1]
	agent := startEnv(t, env, "launch", "--nnodes", "1", "--nproc-per-node", "1", "--backend", "cpu", "--node-addr", "127.0.0.1",
		"--coordinator", addr, "--ca-hash", was, "--", "sleep", "600")
	waitOutput(t, first, "the job to start", func() bool { return strings.Contains(first.err.String(), "generation started") })
	if err := first.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-first.done
	second := startEnv(t, env, coordArgs...)
	waitOutput(t, second, "the restarted coordinator's join line", func() bool { return caHashIn.MatchString(second.err.String()) })
	now := caHashIn.FindStringSubmatch(second.err.String())[1]
	if now == was {
		t.Fatal("the restarted coordinator has the same CA: the test cannot fail")
	}
	code := agent.wait(t, time.Minute) // well within the 2-minute node timeout
	out := agent.err.String()
	if code == 0 {
		t.Errorf("the agent exited 0 after its coordinator restarted:\n%s", out)
	}
	for _, w := range []string{"the coordinator at " + addr + " restarted with a new identity (CA hash " + now + ", was " + was + ")", "the job cannot continue; restart the job"} {
		if !strings.Contains(out, w) {
			t.Errorf("the agent does not say %q:\n%s", w, out)
		}
	}
	for _, bad := range []string{"has lost this node", "does not match --ca-hash"} {
		if strings.Contains(out, bad) {
			t.Errorf("the agent says %q:\n%s", bad, out)
		}
	}
	if strings.Contains(second.err.String(), "node_id=node-1") {
		t.Errorf("the restarted coordinator admitted the old node:\n%s", second.err.String())
	}
}
