package launcher

import (
	"context"
	"fmt"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/gotrain/gotrain/internal/launcher/explain"
	"github.com/gotrain/gotrain/internal/launcher/observe"
	gotrainv1 "github.com/gotrain/gotrain/proto/gotrain/v1"
)

// reportTimeoutExit bounds one ReportWorkerExit call.
const reportTimeoutExit = 10 * time.Second

// queueReport hands an exit or park report to the reporter, so that the
// loop never waits for the coordinator. Reports go out in order, and none is
// dropped (package reportq says how the queue stays bounded).
func (a *agent) queueReport(req *gotrainv1.ReportWorkerExitRequest) {
	req.NodeId = a.nodeID
	a.reports.Put(req)
}

// sendReports sends the queued reports until ctx ends. Before exits, the
// ranks' progress goes out, so that a worker's last progress reaches the
// coordinator before its exit does; one flush serves all the exits taken
// together.
func (a *agent) sendReports(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-a.reports.Ready():
		}
		batch := a.reports.TakeAll()
		for _, req := range batch {
			if !req.GetParked() {
				a.hub.Flush(ctx)
				break
			}
		}
		for _, req := range batch {
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

// onHang prints the verdict and, when it names ranks, queues the request
// for the evidence collector, so that the loop never waits for evidence.
func (a *agent) onHang(req *gotrainv1.EvidenceRequest) {
	v := req.GetVerdict()
	fmt.Fprint(a.cfg.Stderr, explain.FormatVerdictLog(v))
	a.log.Info("hang detected", "verdict", v.GetKind(), "comm", v.GetComm(), "seq", v.GetCollective().GetSeq(), "summary", v.GetSummary())
	if len(req.GetRanks()) == 0 {
		return
	}
	select {
	case a.hangs <- req:
	default:
		a.log.Warn("evidence collector busy; skipping a verdict's evidence", "request", req.GetRequestId())
	}
}

// collectEvidence gathers and reports evidence for the queued verdicts, for
// the ranks named that run here, until ctx ends.
func (a *agent) collectEvidence(ctx context.Context) {
	for {
		var req *gotrainv1.EvidenceRequest
		select {
		case <-ctx.Done():
			return
		case req = <-a.hangs:
		}
		ev := a.hub.Collect(ctx, req, a.cfg.LogDir)
		if a.cfg.Backend == "nccl" {
			ev = append(ev, observe.RASEvidence(ctx, req.GetRanks()[0], a.cfg.Env))
		}
		rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		if _, err := a.coord.ReportEvidence(rctx, &gotrainv1.ReportEvidenceRequest{NodeId: a.nodeID, RequestId: req.GetRequestId(), Evidence: ev}); err != nil {
			a.log.Warn("report evidence", "err", err)
		}
		cancel()
	}
}
