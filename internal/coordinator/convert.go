package coordinator

import (
	"errors"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/gotrain/gotrain/internal/coordinator/job"
	"github.com/gotrain/gotrain/internal/coordinator/kv"
	"github.com/gotrain/gotrain/internal/coordinator/state"
	gotrainv1 "github.com/gotrain/gotrain/proto/gotrain/v1"
)

// Conversions between the wire types and package job's, and from job errors
// to gRPC status codes. This file is the only place that knows both.

func nodeInfoToProto(info job.NodeInfo) *gotrainv1.NodeInfo {
	p := &gotrainv1.NodeInfo{
		Hostname: info.Hostname,
		Address:  info.Address,
		Nproc:    int32(info.Nproc),
		AgentPid: int32(info.AgentPID),
		FreePort: int32(info.FreePort),

		RanksPerGpu: int32(info.RanksPerGPU),

		PreflightFailure: info.PreflightFailure,
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
	out.StepSource = p.StepSource
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
		Repeated:   f.Repeated,
	}
}

// startedEvent is node id's GenerationStarted event: with every node of
// the generation and its ranks, and snapKey (the job's snapshot key, nil
// without a job CA), which only the generation's nodes get this way
// (snaptier: who may use the snapshot peer port, and the replicas' MAC).
func startedEvent(id string, a *job.StartGeneration, snapKey []byte) *gotrainv1.GenerationEvent {
	var nodes []*gotrainv1.GenerationNode
	for _, n := range a.Nodes {
		gn := &gotrainv1.GenerationNode{NodeId: n.NodeID, GroupRank: int32(n.GroupRank)}
		for _, r := range n.Ranks {
			gn.Ranks = append(gn.Ranks, int32(r.Rank))
		}
		nodes = append(nodes, gn)
	}
	for _, n := range a.Nodes {
		if n.NodeID != id {
			continue
		}
		st := &gotrainv1.GenerationStarted{
			Generation:     a.Generation,
			WorldSize:      int32(a.WorldSize),
			GroupRank:      int32(n.GroupRank),
			GroupWorldSize: int32(len(a.Nodes)),
			MasterAddr:     a.MasterAddr,
			MasterPort:     int32(a.MasterPort),
			RestartCount:   int32(a.RestartCount),
			Nodes:          nodes,
			SnapshotKey:    snapKey,
		}
		for _, r := range n.Ranks {
			st.Ranks = append(st.Ranks, &gotrainv1.RankAssignment{Rank: int32(r.Rank), LocalRank: int32(r.LocalRank), Gpu: int32(r.GPU), Survivor: r.Survivor})
		}
		return &gotrainv1.GenerationEvent{Event: &gotrainv1.GenerationEvent_Started{Started: st}}
	}
	return &gotrainv1.GenerationEvent{}
}

// outToProto is one event of node id's outbox, on the wire (snapKey:
// startedEvent).
func outToProto(id string, o state.Out, snapKey []byte) *gotrainv1.GenerationEvent {
	var ev *gotrainv1.GenerationEvent
	switch {
	case o.Started != nil:
		ev = startedEvent(id, o.Started, snapKey)
	case o.Ended != nil:
		ev = endedEvent(*o.Ended)
	case o.Restarting != nil:
		r := o.Restarting
		ev = &gotrainv1.GenerationEvent{Event: &gotrainv1.GenerationEvent_Restarting{Restarting: &gotrainv1.RestartPlanned{
			Generation: r.Ended.Generation, WorldSize: int32(r.World), Failure: failureToProto(r.Ended.Failure),
			Attempt: int32(r.Attempt), MaxAttempts: int32(r.MaxAttempts), WaitMs: r.Wait.Milliseconds(),
		}}}
	case o.Finished != nil:
		ev = &gotrainv1.GenerationEvent{Event: &gotrainv1.GenerationEvent_Finished{Finished: finishedToProto(*o.Finished)}}
	case o.Replicas != nil:
		ev = &gotrainv1.GenerationEvent{Event: &gotrainv1.GenerationEvent_Replicas{Replicas: &gotrainv1.Replicas{Addrs: o.Replicas}}}
	case o.HostReplica:
		ev = &gotrainv1.GenerationEvent{Event: &gotrainv1.GenerationEvent_HostReplica{HostReplica: &gotrainv1.HostReplica{}}}
	case o.Evidence != nil:
		v := o.Evidence.Verdict
		req := &gotrainv1.EvidenceRequest{RequestId: v.ID, Generation: v.Generation, Verdict: verdictToProto(v)}
		for _, r := range o.Evidence.Ranks {
			req.Ranks = append(req.Ranks, int32(r))
		}
		ev = &gotrainv1.GenerationEvent{Event: &gotrainv1.GenerationEvent_Evidence{Evidence: req}}
	default:
		ev = &gotrainv1.GenerationEvent{}
	}
	ev.Seq = o.Seq
	return ev
}

// eventEntry is the log entry of an event the server observed itself.
func eventEntry(ev job.Event) *gotrainv1.LogEntry {
	switch ev := ev.(type) {
	case job.NodeLost:
		return &gotrainv1.LogEntry{Entry: &gotrainv1.LogEntry_NodeLost{NodeLost: &gotrainv1.LogNode{NodeId: ev.NodeID, Reason: ev.Reason}}}
	case job.NodeUnreachable:
		return &gotrainv1.LogEntry{Entry: &gotrainv1.LogEntry_NodeUnreachable{NodeUnreachable: &gotrainv1.LogNode{NodeId: ev.NodeID, Reason: ev.Reason}}}
	case job.NodeReachable:
		return &gotrainv1.LogEntry{Entry: &gotrainv1.LogEntry_NodeReachable{NodeReachable: &gotrainv1.LogNode{NodeId: ev.NodeID}}}
	}
	return &gotrainv1.LogEntry{Entry: &gotrainv1.LogEntry_Tick{Tick: &gotrainv1.LogTick{}}}
}

// stateError is the status of an error of applying an entry: a state
// refusal, a KV store's or the job machine's.
func stateError(err error) error {
	var r *state.Refusal
	switch {
	case err == nil:
		return nil
	case errors.As(err, &r):
		code := map[state.Kind]codes.Code{state.Invalid: codes.InvalidArgument, state.Exhausted: codes.ResourceExhausted,
			state.Precondition: codes.FailedPrecondition, state.Internal: codes.Internal}[r.Kind]
		return status.Error(code, r.Msg)
	case errors.Is(err, kv.ErrConflict), errors.Is(err, kv.ErrTooLarge), errors.Is(err, kv.ErrFull):
		return kvError(err) // limits.go
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	return grpcError(err)
}

func endedEvent(a job.EndGeneration) *gotrainv1.GenerationEvent {
	return &gotrainv1.GenerationEvent{Event: &gotrainv1.GenerationEvent_Ended{Ended: &gotrainv1.GenerationEnded{
		Generation: a.Generation,
		Reason:     a.Reason,
		Failure:    failureToProto(a.Failure),
		Replace:    int32s(a.Replace),
	}}}
}

func int32s(v []int) []int32 {
	var out []int32
	for _, x := range v {
		out = append(out, int32(x))
	}
	return out
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
	case errors.Is(err, job.ErrJobStarted), errors.Is(err, job.ErrJobFinished), errors.Is(err, job.ErrPreflightFailed):
		code = codes.FailedPrecondition
	}
	return status.Error(code, err.Error())
}
