package launcher

import (
	"context"
	"time"

	gotrainv1 "github.com/gotrain/gotrain/proto/gotrain/v1"
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
			rctx, cancel := context.WithTimeout(ctx, reportTimeoutExit)
			if _, err := a.coord.ReportWorkerExit(rctx, req); err != nil {
				a.log.Warn("report worker exit", "rank", req.GetRank(), "err", err)
			}
			cancel()
		}
	}
}
