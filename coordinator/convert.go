package coordinator

import (
	"errors"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/gotrain/gotrain/coordinator/job"
	gotrainv1 "github.com/gotrain/gotrain/proto/gotrain/v1"
)

// Conversions between the wire types and package job's, and from job errors
// to gRPC status codes. This file is the only place that knows both.

func nodeInfoFromProto(p *gotrainv1.NodeInfo) job.NodeInfo {
	info := job.NodeInfo{
		Hostname: p.GetHostname(),
		Address:  p.GetAddress(),
		Nproc:    int(p.GetNproc()),
		AgentPID: int(p.GetAgentPid()),
		FreePort: int(p.GetFreePort()),

		RanksPerGPU: int(p.GetRanksPerGpu()),
	}
	for _, g := range p.GetGpus() {
		info.GPUs = append(info.GPUs, job.GPU{
			Index:    int(g.GetIndex()),
			UUID:     g.GetUuid(),
			PCIBusID: g.GetPciBusId(),
			Name:     g.GetName(),
			NUMANode: int(g.GetNumaNode()),
		})
	}
	return info
}

func nodeInfoToProto(info job.NodeInfo) *gotrainv1.NodeInfo {
	p := &gotrainv1.NodeInfo{
		Hostname: info.Hostname,
		Address:  info.Address,
		Nproc:    int32(info.Nproc),
		AgentPid: int32(info.AgentPID),
		FreePort: int32(info.FreePort),

		RanksPerGpu: int32(info.RanksPerGPU),
	}
	for _, g := range info.GPUs {
		p.Gpus = append(p.Gpus, &gotrainv1.GPU{
			Index:    int32(g.Index),
			Uuid:     g.UUID,
			PciBusId: g.PCIBusID,
			Name:     g.Name,
			NumaNode: int32(g.NUMANode),
		})
	}
	return p
}

func progressFromProto(p *gotrainv1.RankProgress) job.Progress {
	out := job.Progress{
		Rank:             int(p.GetRank()),
		Generation:       p.GetGeneration(),
		Step:             p.GetStep(),
		SamplesPerSecond: p.GetSamplesPerSecond(),
		Pid:              int(p.GetPid()),
	}
	if n := p.GetUnixNanos(); n != 0 {
		out.Time = time.Unix(0, n)
	}
	for _, c := range p.GetComms() {
		out.Comms = append(out.Comms, job.CommProgress{
			Comm:         c.GetComm(),
			EnteredSeq:   c.GetEnteredSeq(),
			CompletedSeq: c.GetCompletedSeq(),
			LastOp:       c.GetLastOp(),
			LastCount:    c.GetLastCount(),
			LastDtype:    c.GetLastDtype(),
		})
		hangFromProto(&out.Comms[len(out.Comms)-1], c) // hang.go
	}
	out.ProcState, out.Attached = p.GetProcessState(), p.GetAttached()
	out.CommsSource, out.CommsNote = p.GetCommsSource(), p.GetCommsNote()
	telemetryFromProto(&out, p) // telemetry.go
	return out
}

func progressToProto(p *job.Progress) *gotrainv1.RankProgress {
	if p == nil {
		return nil
	}
	out := &gotrainv1.RankProgress{
		Rank:             int32(p.Rank),
		Generation:       p.Generation,
		Step:             p.Step,
		SamplesPerSecond: p.SamplesPerSecond,
		Pid:              int32(p.Pid),
	}
	if !p.Time.IsZero() {
		out.UnixNanos = p.Time.UnixNano()
	}
	out.ProcessState, out.Attached = p.ProcState, p.Attached
	out.CommsSource, out.CommsNote = p.CommsSource, p.CommsNote
	telemetryToProto(out, p) // telemetry.go
	for _, c := range p.Comms {
		out.Comms = append(out.Comms, &gotrainv1.CommProgress{
			Comm:         c.Comm,
			EnteredSeq:   c.EnteredSeq,
			CompletedSeq: c.CompletedSeq,
			LastOp:       c.LastOp,
			LastCount:    c.LastCount,
			LastDtype:    c.LastDtype,
		})
		hangToProto(out.Comms[len(out.Comms)-1], c) // hang.go
	}
	return out
}

func failureToProto(f *job.Failure) *gotrainv1.WorkerFailure {
	if f == nil {
		return nil
	}
	return &gotrainv1.WorkerFailure{
		Rank:       int32(f.Rank),
		Hostname:   f.Hostname,
		Pid:        int32(f.Pid),
		ExitCode:   int32(f.ExitCode),
		Signal:     f.Signal,
		StderrTail: f.StderrTail,
		NodeId:     f.NodeID,
		Reason:     f.Reason,
		OomKilled:  f.OOMKilled,
		XidErrors:  f.XIDErrors,
		Notes:      f.Notes,
		Permanent:  f.Permanent,
	}
}

// startedEvents returns each node's GenerationStarted event, by node id.
func startedEvents(a job.StartGeneration) map[string]*gotrainv1.GenerationEvent {
	out := make(map[string]*gotrainv1.GenerationEvent, len(a.Nodes))
	for _, n := range a.Nodes {
		st := &gotrainv1.GenerationStarted{
			Generation:     a.Generation,
			WorldSize:      int32(a.WorldSize),
			GroupRank:      int32(n.GroupRank),
			GroupWorldSize: int32(len(a.Nodes)),
			MasterAddr:     a.MasterAddr,
			MasterPort:     int32(a.MasterPort),
			RestartCount:   int32(a.RestartCount),
		}
		for _, r := range n.Ranks {
			st.Ranks = append(st.Ranks, &gotrainv1.RankAssignment{Rank: int32(r.Rank), LocalRank: int32(r.LocalRank), Gpu: int32(r.GPU), Survivor: r.Survivor})
		}
		out[n.NodeID] = &gotrainv1.GenerationEvent{Event: &gotrainv1.GenerationEvent_Started{Started: st}}
	}
	return out
}

func endedEvent(a job.EndGeneration) *gotrainv1.GenerationEvent {
	return &gotrainv1.GenerationEvent{Event: &gotrainv1.GenerationEvent_Ended{Ended: &gotrainv1.GenerationEnded{
		Generation: a.Generation,
		Reason:     a.Reason,
		Failure:    failureToProto(a.Failure),
	}}}
}

func finishedToProto(a job.FinishJob) *gotrainv1.JobFinished {
	return &gotrainv1.JobFinished{
		Succeeded: a.Succeeded,
		ExitCode:  int32(a.ExitCode),
		Failure:   failureToProto(a.Failure),
		Message:   a.Message,
	}
}

func statusToProto(st job.Status) *gotrainv1.JobStatus {
	out := &gotrainv1.JobStatus{
		RunId:        st.RunID,
		State:        string(st.State),
		Generation:   st.Generation,
		WorldSize:    int32(st.WorldSize),
		RestartCount: int32(st.RestartCount),
		Failure:      failureToProto(st.Failure),
	}
	for _, n := range st.Nodes {
		out.Nodes = append(out.Nodes, &gotrainv1.NodeStatus{NodeId: n.NodeID, Info: nodeInfoToProto(n.Info), GroupRank: int32(n.GroupRank)})
	}
	for _, r := range st.Ranks {
		out.Ranks = append(out.Ranks, &gotrainv1.RankStatus{
			Rank:      int32(r.Rank),
			NodeId:    r.NodeID,
			Hostname:  r.Hostname,
			LocalRank: int32(r.LocalRank),
			State:     string(r.State),
			ExitCode:  int32(r.ExitCode),
			Progress:  progressToProto(r.Progress),
			Gpu:       rankGPU(st, r),
		})
	}
	for _, v := range st.Verdicts {
		out.Verdicts = append(out.Verdicts, verdictToProto(v))
	}
	return out
}

// grpcError turns an error of package job into a gRPC status.
func grpcError(err error) error {
	code := codes.Internal
	switch {
	case errors.Is(err, job.ErrInvalidEvent):
		code = codes.InvalidArgument
	case errors.Is(err, job.ErrUnknownNode):
		code = codes.NotFound
	case errors.Is(err, job.ErrDuplicateNode):
		code = codes.AlreadyExists
	case errors.Is(err, job.ErrJobStarted), errors.Is(err, job.ErrJobFinished):
		code = codes.FailedPrecondition
	}
	return status.Error(code, err.Error())
}
