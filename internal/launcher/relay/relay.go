package relay

import (
	"context"
	"log/slog"
	"sync"

	"google.golang.org/grpc"

	"github.com/gotrain/gotrain/internal/launcher/agentcore"
	"github.com/gotrain/gotrain/internal/token"
	gotrainv1 "github.com/gotrain/gotrain/proto/gotrain/v1"
)

// Server serves the Agent API to this node's workers by forwarding each
// call to the coordinator. Workers never dial the coordinator themselves, so
// its connection count grows with nodes, not ranks, and a worker needs
// nothing but the local socket's path.
type Server struct {
	gotrainv1.UnimplementedAgentServer
	Coord  gotrainv1.CoordinatorClient
	NodeID string
	Hub    *Hub // progress and stacks of attached workers (progress.go)
	// Claims is what the agent started, which hellos must match
	// (claims.go); nil: no check.
	Claims *Claims
	// Standbys are the standbys' open streams (standby.go); Post hands
	// the agent's loop a standby's hello or detach, and LoopDone closes
	// when the loop returned.
	Standbys *Standbys
	Post     func(agentcore.Event)
	LoopDone <-chan struct{}
	Log      *slog.Logger

	budgetOnce sync.Once
	calls      *budget // the relayed calls in flight (budget.go)
}

// budget returns the relay's call budget, made on first use.
func (r *Server) budget() *budget {
	r.budgetOnce.Do(func() {
		if r.calls == nil {
			r.calls = newBudget(perWorkerCalls, relayedCalls)
		}
	})
	return r.calls
}

var _ gotrainv1.AgentServer = (*Server)(nil)

// NewGRPCServer is the gRPC server of the agent's socket: s behind the job
// token, with each connection's peer process as the kernel tells it
// (peerCredentials, claims.go).
func NewGRPCServer(jobToken string, s *Server) *grpc.Server {
	srv := grpc.NewServer(append(token.ServerOptions(jobToken), grpc.Creds(peerCredentials{}))...)
	gotrainv1.RegisterAgentServer(srv, s)
	return srv
}

// The calls below are forwarded to the coordinator within the relay's
// budget (budget.go).

func (r *Server) KVPut(ctx context.Context, req *gotrainv1.KVPutRequest) (*gotrainv1.KVPutResponse, error) {
	return relayed(r, ctx, "KVPut", func() (*gotrainv1.KVPutResponse, error) { return r.Coord.KVPut(ctx, req) })
}

func (r *Server) KVGet(ctx context.Context, req *gotrainv1.KVGetRequest) (*gotrainv1.KVGetResponse, error) {
	return relayed(r, ctx, "KVGet", func() (*gotrainv1.KVGetResponse, error) { return r.Coord.KVGet(ctx, req) })
}

func (r *Server) Barrier(ctx context.Context, req *gotrainv1.BarrierRequest) (*gotrainv1.BarrierResponse, error) {
	return relayed(r, ctx, "Barrier", func() (*gotrainv1.BarrierResponse, error) { return r.Coord.Barrier(ctx, req) })
}

func (r *Server) ReportProgress(ctx context.Context, req *gotrainv1.ReportProgressRequest) (*gotrainv1.ReportProgressResponse, error) {
	req.NodeId = r.NodeID
	return relayed(r, ctx, "ReportProgress", func() (*gotrainv1.ReportProgressResponse, error) { return r.Coord.ReportProgress(ctx, req) })
}
