package launcher

import (
	"context"
	"fmt"
	"os"
	"time"

	gotrainv1 "github.com/gotrain/gotrain/proto/gotrain/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/gotrain/gotrain/internal/jobenv"
)

// join registers this node, retrying while the coordinator is not up yet.
func (a *agent) join(ctx context.Context, coordAddr string) error {
	port, err := freePort(a.cfg.NodeAddress)
	if err != nil {
		return err
	}
	req := &gotrainv1.JoinRequest{Node: &gotrainv1.NodeInfo{
		Hostname: a.host, Address: a.cfg.NodeAddress, Nproc: int32(a.cfg.NprocPerNode),
		AgentPid: int32(os.Getpid()), FreePort: int32(port), Gpus: a.place.joinGPUs(),
	}, Settings: a.cfg.JobSettings.Given(a.cfg.JobFlagsGiven)}
	ctx, cancel := context.WithTimeout(ctx, a.cfg.JoinTimeout)
	defer cancel()
	backoff := 50 * time.Millisecond
	for {
		resp, err := a.coord.Join(ctx, req)
		if err == nil {
			a.nodeID = resp.GetNodeId()
			for _, w := range resp.GetWarnings() {
				fmt.Fprintf(a.cfg.Stderr, "gotrain: warning: %s\n", w)
			}
			a.gossipPort = int(resp.GetGossipPort())
			if id := resp.GetRunId(); id != "" && id != a.cfg.RunID {
				a.log.Info("taking the coordinator's run id", "run_id", id, "ours", a.cfg.RunID)
				a.cfg.RunID = id // every node's workers see the same TORCHELASTIC_RUN_ID
			}
			return nil
		}
		if status.Code(err) == codes.PermissionDenied {
			return fmt.Errorf("join the coordinator at %s: wrong job token: pass the --job-token (or set %s) that the first node or `gotrain coordinator` printed: %w",
				coordAddr, jobenv.JobToken, err)
		}
		if status.Code(err) == codes.FailedPrecondition {
			// A setting that contradicts the job's, or a job already
			// started: the coordinator's message says what to do.
			return &joinRefused{addr: coordAddr, err: err}
		}
		if status.Code(err) != codes.Unavailable || ctx.Err() != nil {
			return fmt.Errorf("join the coordinator at %s: %w", coordAddr, err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("join the coordinator at %s: not reachable within %s (is it running? check --coordinator): %w", coordAddr, a.cfg.JoinTimeout, err)
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 2*time.Second)
	}
}

// joinRefused is a Join the coordinator refused for good: it reads as the
// coordinator's message, without gRPC's "rpc error: code = ..." around it.
type joinRefused struct {
	addr string
	err  error
}

func (e *joinRefused) Error() string {
	return fmt.Sprintf("join the coordinator at %s: %s", e.addr, status.Convert(e.err).Message())
}

func (e *joinRefused) Unwrap() error { return e.err }
