package integration

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gotrain/gotrain/internal/jobtls"
	gotrainv1 "github.com/gotrain/gotrain/proto/gotrain/v1"
)

// A token holder that joins a fixed-size job and never opens its watch
// stream took the second place: the job started on it, made no progress,
// and the real node was refused. It holds no place now: it is dropped
// after the node timeout, named, and the real node's join runs the job.
func TestJoinedNodeThatNeverAttachesIsDropped(t *testing.T) {
	t.Parallel()
	flags := []string{"--nnodes", "2", "--node-timeout", "3s"}
	first := startAgent(t, slices.Concat(flags, []string{"--coordinator-listen", "127.0.0.1:0", "--", bin.testprog, "env"})...)
	join := joinArgs(t, first)
	addr, tok, caHash := join[1], join[3], join[5]

	// The squatter: a join over gRPC with the token and a CSR, then nothing.
	_, csr, err := jobtls.NewNodeKey()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	resp, err := client(t, "127.0.0.1", addr, tok, caHash).Join(ctx, &gotrainv1.JoinRequest{Csr: csr,
		Node: &gotrainv1.NodeInfo{Hostname: "squatter", Address: "127.0.0.66", Nproc: 1, FreePort: 31337, AgentPid: 666}})
	if err != nil {
		t.Fatalf("the squatter's join: %v", err)
	}
	waitOutput(t, first, "the squatter dropped and named", func() bool {
		return strings.Contains(first.err.String(), "node "+resp.GetNodeId()+" on squatter (127.0.0.66, agent pid 666) joined") &&
			strings.Contains(first.err.String(), "never opened its watch stream: dropped")
	})

	second := startAgent(t, slices.Concat(flags, join, []string{"--", bin.testprog, "env"})...)
	if codes := exits(t, 2*time.Minute, first, second); codes[0] != 0 || codes[1] != 0 {
		t.Fatalf("exit statuses %v, want 0 and 0\n%s", codes, dump(first, second))
	}
	for _, j := range []*job{first, second} {
		if strings.Contains(j.out.String(), "127.0.0.66") {
			t.Errorf("a rank was told of the squatter:\n%s", j.out.String())
		}
	}
	if !strings.Contains(first.out.String(), "WORLD_SIZE=4") {
		t.Errorf("the job did not run on both real nodes (2 ranks each):\n%s", first.out.String())
	}
}
