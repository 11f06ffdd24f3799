package coordinator

import (
	"context"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/gotrain/gotrain/internal/coordinator/job"
	gotrainv1 "github.com/gotrain/gotrain/proto/gotrain/v1"
)

// Hang diagnosis: carrying out the detector's verdicts, taking the agents'
// evidence, and answering `gotrain diagnose`.

// ReportEvidence attaches an agent's evidence to its verdict.
func (s *Server) ReportEvidence(_ context.Context, req *gotrainv1.ReportEvidenceRequest) (*gotrainv1.ReportEvidenceResponse, error) {
	if _, err := s.commit(&gotrainv1.LogEntry{Entry: &gotrainv1.LogEntry_Evidence{Evidence: req}}); err != nil {
		return nil, err
	}
	return &gotrainv1.ReportEvidenceResponse{}, nil
}

// Diagnose returns the job with its verdicts, and what the detector would
// say now about stalls not yet past the timeout.
func (s *Server) Diagnose(context.Context, *gotrainv1.DiagnoseRequest) (*gotrainv1.DiagnoseResponse, error) {
	s.mu.Lock()
	now := s.now()
	st := s.st.Machine().Status()
	sus := s.st.Machine().Suspected(now)
	timeout, adaptive := s.st.Machine().HangTimeout() // straggler: the adaptive timeout in force
	s.mu.Unlock()
	resp := &gotrainv1.DiagnoseResponse{Status: statusToProto(st), NowUnixNanos: now.UnixNano(), HangTimeoutMs: timeout.Milliseconds(),
		HangTimeoutAdaptive: adaptive}
	for _, v := range sus {
		resp.Suspected = append(resp.Suspected, verdictToProto(v))
	}
	if resp.Status == nil {
		return nil, status.Error(codes.Internal, "no job status")
	}
	return resp, nil
}

func unixNanos(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

func collectiveToProto(c job.Collective) *gotrainv1.Collective {
	return &gotrainv1.Collective{Seq: c.Seq, Op: c.Op, Dtype: c.DType, Count: c.Count, Root: int32(c.Root),
		ReduceOp: c.ReduceOp, State: c.State, EnqueuedUnixNanos: unixNanos(c.Enqueued)}
}

func hangToProto(dst *gotrainv1.CommProgress, c job.CommProgress) {
	if c.Pending != nil {
		dst.Pending = collectiveToProto(*c.Pending)
	}
	dst.CompletedUnixNanos = unixNanos(c.CompletedTime)
	dst.Error, dst.ErrorSeq = c.Error, c.ErrorSeq
	dst.WaitNanos = int64(c.Wait) // (the recent waits stay out of the status: the straggler check's input only)
}

func verdictToProto(v job.Verdict) *gotrainv1.HangVerdict {
	out := &gotrainv1.HangVerdict{
		Id: v.ID, Kind: string(v.Kind), Generation: v.Generation, Comm: v.Comm,
		Collective:            collectiveToProto(v.Collective),
		LastProgressUnixNanos: unixNanos(v.Since), DetectedUnixNanos: unixNanos(v.Detected),
		Summary: v.Summary, Details: v.Details,
		// straggler: the timeout used and a straggler's figures.
		TimeoutMs: v.Timeout.Milliseconds(), TimeoutAdaptive: v.Adaptive,
	}
	if f := v.Straggler; f != nil {
		out.Straggler = &gotrainv1.StragglerFigures{Slower: f.Slower, ComputeNanos: int64(f.Compute), OthersNanos: int64(f.Others),
			LastShare: f.LastShare, Common: int32(f.Common)}
	}
	for _, r := range v.Waiting {
		out.Waiting = append(out.Waiting, int32(r))
	}
	for _, c := range v.Culprits {
		pc := &gotrainv1.Culprit{Rank: int32(c.Rank), NodeId: c.NodeID, Hostname: c.Hostname, Pid: int32(c.Pid),
			Gpu: int32(c.GPU), GpuUuid: c.GPUUUID, ProcessState: c.ProcState, Doing: c.Doing}
		if c.Collective != nil {
			pc.Collective = collectiveToProto(*c.Collective)
		}
		out.Culprits = append(out.Culprits, pc)
	}
	for _, e := range v.Evidence {
		out.Evidence = append(out.Evidence, &gotrainv1.Evidence{Rank: int32(e.Rank), Pid: int32(e.Pid), Kind: e.Kind, Text: e.Text})
	}
	return out
}

// rankGPU is the GPU index of a rank on its node, -1 for none.
func rankGPU(st job.Status, r job.RankStatus) int32 {
	for _, n := range st.Nodes {
		if n.NodeID == r.NodeID && r.LocalRank < len(n.Info.GPUs) {
			return int32(n.Info.GPUs[r.LocalRank].Index)
		}
	}
	return -1
}
