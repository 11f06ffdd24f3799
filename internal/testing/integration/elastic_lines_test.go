package integration

import (
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// An elastic job (--nnodes 1:2) says what happens to its size, on every
// node: a node that joins a running job is "node-2 joined: the job grows to
// 2 nodes (4 ranks)", the loss of one is "going on with 1 node (2 ranks)",
// not "restarting all 4 ranks".
func TestElasticGrowShrinkLines(t *testing.T) {
	t.Parallel()
	flags := []string{"--nnodes", "1:2", "--max-restarts", "3", "--join-settle", "1s", "--grace-period", "1s"}
	program := []string{"--", "sh", "-c", "echo up; exec sleep 600"}
	a := startAgent(t, slices.Concat(flags, []string{"--coordinator-listen", "127.0.0.1:0"}, program)...)
	join := joinArgs(t, a)
	waitOutput(t, a, "the first node's ranks running alone", func() bool { return strings.Contains(a.out.String(), "[rank 1] up") })
	b := startAgent(t, slices.Concat(flags, join, program)...)
	grew := "gotrain: node-2 joined: the job grows to 2 nodes (4 ranks)"
	waitOutput(t, a, "the first node saying the job grew", func() bool { return strings.Contains(a.err.String(), grew) })
	waitOutput(t, b, "the second node's joined line", func() bool { return strings.Contains(b.err.String(), "gotrain: joined run ") })
	if err := b.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	shrank := "gotrain: going on with 1 node (2 ranks)"
	waitOutput(t, a, "the first node saying it goes on alone", func() bool { return strings.Contains(a.err.String(), shrank) })
	if err := a.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	a.wait(t, time.Minute)
	out := a.err.String()
	if strings.Count(out, grew) != 1 || strings.Count(out, shrank) != 1 {
		t.Errorf("want one grow and one shrink line:\n%s", out)
	}
	if strings.Contains(out, "restarting all 4 ranks") {
		t.Errorf("the loss of a node reads as a restart of all 4 ranks:\n%s", out)
	}
	if t.Failed() || testing.Verbose() {
		t.Log(dump(a, b))
	}
}
