package launcher

import (
	"context"
	"log/slog"

	gotrainv1 "github.com/gotrain/gotrain/proto/gotrain/v1"
)

// relay serves the Agent API to this node's workers by forwarding each call to
// the coordinator. Workers never dial the coordinator themselves, so its
// connection count grows with nodes, not ranks, and a worker needs nothing but
// the local socket's path.
type relay struct {
	gotrainv1.UnimplementedAgentServer
	coord  gotrainv1.CoordinatorClient
	nodeID string
	hub    *hub   // progress and stacks of attached workers (progress.go)
	agent  *agent // its loop takes standbys' hellos (standby.go)
	// claims is what the agent started, which hellos must match
	// (claims.go); nil: no check.
	claims *claims
	log    *slog.Logger
}

var _ gotrainv1.AgentServer = (*relay)(nil)

func (r *relay) KVPut(ctx context.Context, req *gotrainv1.KVPutRequest) (*gotrainv1.KVPutResponse, error) {
	return r.coord.KVPut(ctx, req)
}

func (r *relay) KVGet(ctx context.Context, req *gotrainv1.KVGetRequest) (*gotrainv1.KVGetResponse, error) {
	return r.coord.KVGet(ctx, req)
}

func (r *relay) Barrier(ctx context.Context, req *gotrainv1.BarrierRequest) (*gotrainv1.BarrierResponse, error) {
	return r.coord.Barrier(ctx, req)
}

func (r *relay) ReportProgress(ctx context.Context, req *gotrainv1.ReportProgressRequest) (*gotrainv1.ReportProgressResponse, error) {
	req.NodeId = r.nodeID
	return r.coord.ReportProgress(ctx, req)
}
