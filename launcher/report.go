package launcher

import (
	"context"
	"time"

	gotrainv1 "github.com/gotrain/gotrain/proto/gotrain/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// reportTimeoutExit bounds one ReportWorkerExit call.
const reportTimeoutExit = 10 * time.Second

// queueReport hands an exit or park report to the reporter, so that the
// loop never waits for the coordinator. Reports go out in order.
func (a *agent) queueReport(req *gotrainv1.ReportWorkerExitRequest) {
	req.NodeId = a.nodeID
	select {
	case a.reports <- req:
	default:
		// The reporter is far behind (the coordinator is not answering):
		// the coordinator will hear of this node through its stream.
		a.log.Warn("report queue full; dropping a report", "rank", req.GetRank(), "generation", req.GetGeneration())
	}
}

// sendReports sends the queued reports until ctx ends. Before an exit, the
// ranks' progress goes out, so that the worker's last progress reaches the
// coordinator before its exit does.
func (a *agent) sendReports(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case req := <-a.reports:
			if !req.GetParked() {
				a.hub.flush(ctx)
			}
			a.sendReport(ctx, req)
		}
	}
}

// sendReport sends one report, trying again while the coordinator is out of
// reach, for up to the node timeout (a blip must not lose an exit).
func (a *agent) sendReport(ctx context.Context, req *gotrainv1.ReportWorkerExitRequest) {
	deadline := time.Now().Add(max(a.nodeTimeout, reportTimeoutExit))
	for {
		rctx, cancel := context.WithTimeout(ctx, reportTimeoutExit)
		_, err := a.coord.ReportWorkerExit(rctx, req)
		cancel()
		if err == nil || ctx.Err() != nil {
			return
		}
		if c := status.Code(err); (c != codes.Unavailable && c != codes.DeadlineExceeded) || time.Now().After(deadline) {
			a.log.Warn("report worker exit", "rank", req.GetRank(), "err", err)
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(rewatchEvery):
		}
	}
}
