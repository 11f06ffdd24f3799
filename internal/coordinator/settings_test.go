package coordinator

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/gotrain/gotrain/internal/coordinator/job"
	gotrainv1 "github.com/gotrain/gotrain/proto/gotrain/v1"
)

func TestCheckSettings(t *testing.T) {
	jc := job.Config{RunID: "run-test", Nodes: 2, MaxRestarts: 3, RestartBackoff: 2 * time.Second,
		HangTimeout: 2 * time.Minute, OnHang: "report", RendezvousTimeout: 10 * time.Minute}
	for _, tc := range []struct {
		name  string
		given *gotrainv1.JobSettings
		err   []string // the problems, in order; nil: accepted
		warn  []string // the warnings, in order
	}{
		{name: "nothing given", given: nil},
		{name: "empty", given: &gotrainv1.JobSettings{}},
		{name: "all equal", given: &gotrainv1.JobSettings{
			Nodes: proto.Int32(2), MaxRestarts: proto.Int32(3), RestartBackoffMs: proto.Int64(2000),
			HangTimeoutMs: proto.Int64(120_000), OnHang: proto.String("report"), RendezvousTimeoutMs: proto.Int64(600_000),
			RunId: proto.String("run-test"),
		}},
		// Given as zero is given: compared, not skipped.
		{name: "max restarts 0 given", given: &gotrainv1.JobSettings{MaxRestarts: proto.Int32(0)},
			err: []string{"--max-restarts 0 on this node, but the job was started with --max-restarts 3: drop the flag on joining nodes or give the same value"}},
		{name: "max restarts", given: &gotrainv1.JobSettings{MaxRestarts: proto.Int32(5)},
			err: []string{"--max-restarts 5 on this node, but the job was started with --max-restarts 3: drop the flag on joining nodes or give the same value"}},
		{name: "nnodes", given: &gotrainv1.JobSettings{Nodes: proto.Int32(4)},
			err: []string{"--nnodes 4 on this node, but the job was started with --nnodes 2: drop the flag on joining nodes or give the same value"}},
		{name: "on hang", given: &gotrainv1.JobSettings{OnHang: proto.String("restart")},
			err: []string{"--on-hang restart on this node, but the job was started with --on-hang report: drop the flag on joining nodes or give the same value"}},
		{name: "on straggler", given: &gotrainv1.JobSettings{OnStraggler: proto.String("replace")},
			err: []string{"--on-straggler replace on this node, but the job was started with --on-straggler report: drop the flag on joining nodes or give the same value"}},
		{name: "straggler persist", given: &gotrainv1.JobSettings{StragglerPersistMs: proto.Int64(5000)},
			warn: []string{"--straggler-persist 5s on this node, but the job was started with --straggler-persist 30s: the job's value applies (drop the flag on joining nodes or give the same value)"}},
		{name: "straggler persist equal", given: &gotrainv1.JobSettings{OnStraggler: proto.String("report"), StragglerPersistMs: proto.Int64(30_000)}},
		{name: "hang timeout", given: &gotrainv1.JobSettings{HangTimeoutMs: proto.Int64(300_000)},
			warn: []string{"--hang-timeout 5m0s on this node, but the job was started with --hang-timeout 2m0s: the job's value applies (drop the flag on joining nodes or give the same value)"}},
		{name: "restart backoff", given: &gotrainv1.JobSettings{RestartBackoffMs: proto.Int64(0)},
			warn: []string{"--restart-backoff 0s on this node, but the job was started with --restart-backoff 2s: the job's value applies (drop the flag on joining nodes or give the same value)"}},
		{name: "rendezvous timeout", given: &gotrainv1.JobSettings{RendezvousTimeoutMs: proto.Int64(0)},
			warn: []string{"--rendezvous-timeout 0s on this node, but the job was started with --rendezvous-timeout 10m0s: the job's value applies (drop the flag on joining nodes or give the same value)"}},
		{name: "run id", given: &gotrainv1.JobSettings{RunId: proto.String("mine")},
			warn: []string{"--run-id mine on this node, but the job was started with --run-id run-test: the job's value applies (drop the flag on joining nodes or give the same value)"}},
		{name: "errors and warnings together", given: &gotrainv1.JobSettings{
			Nodes: proto.Int32(3), MaxRestarts: proto.Int32(0), HangTimeoutMs: proto.Int64(1000),
		},
			err: []string{
				"--nnodes 3 on this node, but the job was started with --nnodes 2: drop the flag on joining nodes or give the same value",
				"--max-restarts 0 on this node, but the job was started with --max-restarts 3: drop the flag on joining nodes or give the same value",
			},
			warn: []string{"--hang-timeout 1s on this node, but the job was started with --hang-timeout 2m0s: the job's value applies (drop the flag on joining nodes or give the same value)"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			warn, err := checkSettings(jc, tc.given)
			if !slices.Equal(warn, tc.warn) {
				t.Errorf("warnings\n got %q\nwant %q", warn, tc.warn)
			}
			if tc.err == nil {
				if err != nil {
					t.Errorf("err = %v, want nil", err)
				}
				return
			}
			if !errors.Is(err, ErrSettingsMismatch) {
				t.Fatalf("err = %v, want ErrSettingsMismatch", err)
			}
			if want := strings.Join(tc.err, "; "); err.Error() != want {
				t.Errorf("err\n got %q\nwant %q", err, want)
			}
		})
	}
}

// A Join whose explicitly given setting contradicts the job's is refused
// over gRPC with both values named; an equal one, or none, is accepted.
func TestJoinChecksSettings(t *testing.T) {
	_, addr := startServer(t, Config{Job: job.Config{Nodes: 3, MaxRestarts: 3, HangTimeout: time.Minute}}, testHooks{})
	c := newClient(t, addr)
	node := func(host string) *gotrainv1.NodeInfo {
		return &gotrainv1.NodeInfo{Hostname: host, Address: "10.0.0.1", Nproc: 1, FreePort: 1, AgentPid: 4000}
	}

	_, err := c.Join(rpcCtx(t), &gotrainv1.JoinRequest{Node: node("host-a"),
		Settings: &gotrainv1.JobSettings{MaxRestarts: proto.Int32(5), Nodes: proto.Int32(3)}})
	wantCode(t, "join with --max-restarts 5", err, codes.FailedPrecondition)
	want := "--max-restarts 5 on this node, but the job was started with --max-restarts 3: drop the flag on joining nodes or give the same value"
	if msg := status.Convert(err).Message(); msg != want {
		t.Errorf("message\n got %q\nwant %q", msg, want)
	}

	resp, err := c.Join(rpcCtx(t), &gotrainv1.JoinRequest{Node: node("host-b"),
		Settings: &gotrainv1.JobSettings{MaxRestarts: proto.Int32(3), Nodes: proto.Int32(3)}})
	if err != nil || len(resp.GetWarnings()) != 0 {
		t.Fatalf("join with equal settings: %v, %v", resp, err)
	}
	resp, err = c.Join(rpcCtx(t), &gotrainv1.JoinRequest{Node: node("host-c")})
	if err != nil || len(resp.GetWarnings()) != 0 {
		t.Fatalf("join without settings: %v, %v", resp, err)
	}
	// The refused join took no node id: the two accepted are node-1 and node-2.
	if resp.GetNodeId() != "node-2" {
		t.Errorf("node id %q, want node-2", resp.GetNodeId())
	}
	resp, err = c.Join(rpcCtx(t), &gotrainv1.JoinRequest{Node: node("host-d"),
		Settings: &gotrainv1.JobSettings{HangTimeoutMs: proto.Int64(5000)}})
	if err != nil {
		t.Fatalf("join with another --hang-timeout: %v", err)
	}
	if w := resp.GetWarnings(); len(w) != 1 || !strings.Contains(w[0], "--hang-timeout 5s on this node, but the job was started with --hang-timeout 1m0s") {
		t.Errorf("warnings %q", w)
	}
	if st, err := c.GetJobStatus(rpcCtx(t), &gotrainv1.GetJobStatusRequest{}); err != nil || len(st.GetNodes()) != 3 {
		t.Errorf("status: %d nodes, %v; want 3 (the refused node is not in the job)", len(st.GetNodes()), err)
	}
}
