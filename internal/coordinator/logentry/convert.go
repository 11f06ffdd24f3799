package logentry

import (
	"math"
	"time"

	"github.com/gotrain/gotrain/internal/coordinator/job"
	"github.com/gotrain/gotrain/internal/coordinator/state"
	gotrainv1 "github.com/gotrain/gotrain/proto/gotrain/v1"
)

// ConfigToProto is c as a config entry.
func ConfigToProto(c state.Config) *gotrainv1.LogConfig {
	j := c.Job
	return &gotrainv1.LogConfig{RunId: j.RunID, Nodes: int32(j.Nodes), MinNodes: int32(j.MinNodes), NodeTimeoutNs: int64(j.NodeTimeout),
		JoinSettleNs: int64(j.JoinSettle), MaxRestarts: int32(j.MaxRestarts), RestartCountBase: int32(j.RestartCountBase),
		RestartBackoffNs: int64(j.RestartBackoff), HangTimeoutNs: int64(j.HangTimeout), OnHang: j.OnHang,
		RendezvousTimeoutNs: int64(j.RendezvousTimeout),
		OnStraggler:         j.OnStraggler, StragglerPersistNs: int64(j.StragglerPersist), StragglerCooldownNs: int64(j.StragglerCooldown),
		Attach: j.Attach,
		Peers:  c.Peers, Want: int32(c.Want), NprocPerNode: int32(c.NprocPerNode), RanksPerJob: int32(c.RanksPerJob)}
}

// ConfigFromProto is a config entry's configuration.
func ConfigFromProto(p *gotrainv1.LogConfig) state.Config {
	d := func(n int64) time.Duration { return time.Duration(n) }
	return state.Config{
		Job: job.Config{RunID: p.GetRunId(), Nodes: int(p.GetNodes()), MinNodes: int(p.GetMinNodes()), NodeTimeout: d(p.GetNodeTimeoutNs()),
			JoinSettle: d(p.GetJoinSettleNs()), MaxRestarts: int(p.GetMaxRestarts()), RestartCountBase: int(p.GetRestartCountBase()),
			RestartBackoff: d(p.GetRestartBackoffNs()), HangTimeout: d(p.GetHangTimeoutNs()), OnHang: p.GetOnHang(),
			RendezvousTimeout: d(p.GetRendezvousTimeoutNs()),
			OnStraggler:       p.GetOnStraggler(), StragglerPersist: d(p.GetStragglerPersistNs()), StragglerCooldown: d(p.GetStragglerCooldownNs()),
			Attach: p.GetAttach()},
		Peers: p.GetPeers(), Want: int(p.GetWant()), NprocPerNode: int(p.GetNprocPerNode()), RanksPerJob: int(p.GetRanksPerJob()),
	}
}

// JoinFromProto is the join of req (host: its agent runs the coordinator;
// csr: its CSR's SHA-256).
func JoinFromProto(req *gotrainv1.JoinRequest, host bool, csr []byte) state.Join {
	j := state.Join{Node: NodeInfo(req.GetNode()), NodeRank: -1, Settings: Settings(req.GetSettings()), Host: host, CSR: csr}
	if n := req.GetNode(); n != nil && n.NodeRank != nil {
		j.NodeRank = max(int(*n.NodeRank), -1)
	}
	return j
}

// Settings are the job-wide settings a joining agent was given.
func Settings(g *gotrainv1.JobSettings) state.Settings {
	if g == nil {
		return state.Settings{}
	}
	s := state.Settings{Given: true, RunID: g.RunId, OnHang: g.OnHang, OnStraggler: g.OnStraggler}
	num := func(v *int32) *int {
		if v == nil {
			return nil
		}
		n := int(*v)
		return &n
	}
	ms := func(v *int64) *time.Duration {
		if v == nil {
			return nil
		}
		d := time.Duration(*v) * time.Millisecond
		return &d
	}
	s.Nodes, s.MinNodes, s.MaxRestarts = num(g.Nodes), num(g.MinNodes), num(g.MaxRestarts)
	s.RestartBackoff, s.HangTimeout, s.RendezvousTimeout = ms(g.RestartBackoffMs), ms(g.HangTimeoutMs), ms(g.RendezvousTimeoutMs)
	s.StragglerPersist = ms(g.StragglerPersistMs)
	return s
}

// NodeInfo is a node's facts.
func NodeInfo(p *gotrainv1.NodeInfo) job.NodeInfo {
	info := job.NodeInfo{
		Hostname:    p.GetHostname(),
		Address:     p.GetAddress(),
		Nproc:       int(p.GetNproc()),
		AgentPID:    int(p.GetAgentPid()),
		FreePort:    int(p.GetFreePort()),
		RanksPerGPU: int(p.GetRanksPerGpu()),

		PreflightFailure: p.GetPreflightFailure(),
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

// WorkerExit is a worker's exit, or its parking (req.parked).
func WorkerExit(req *gotrainv1.ReportWorkerExitRequest) job.Event {
	if req.GetParked() {
		return job.WorkerParked{NodeID: req.GetNodeId(), Generation: req.GetGeneration(), Rank: int(req.GetRank()), Pid: int(req.GetPid())}
	}
	return job.WorkerExited{
		NodeID:     req.GetNodeId(),
		Generation: req.GetGeneration(),
		Rank:       int(req.GetRank()),
		Pid:        int(req.GetPid()),
		ExitCode:   int(req.GetExitCode()),
		Signal:     req.GetSignal(),
		StderrTail: req.GetStderrTail(),
		OOMKilled:  req.GetOomKilled(),
		XIDErrors:  req.GetXidErrors(),
		Notes:      req.GetNotes(),
		Permanent:  req.GetPermanent(),
		Repeated:   req.GetRepeated(),
		Stopped:    req.GetStopped(),
	}
}

func fromUnixNanos(n int64) time.Time {
	if n == 0 {
		return time.Time{}
	}
	return time.Unix(0, n).UTC()
}

// Progress is a rank's progress report.
func Progress(p *gotrainv1.RankProgress) job.Progress {
	out := job.Progress{
		Rank:             int(p.GetRank()),
		Generation:       p.GetGeneration(),
		Step:             p.GetStep(),
		SamplesPerSecond: finite(p.GetSamplesPerSecond()),
		Pid:              int(p.GetPid()),
		Time:             fromUnixNanos(p.GetUnixNanos()),
	}
	for _, c := range p.GetComms() {
		cp := job.CommProgress{
			Comm:          c.GetComm(),
			EnteredSeq:    c.GetEnteredSeq(),
			CompletedSeq:  c.GetCompletedSeq(),
			LastOp:        c.GetLastOp(),
			LastCount:     c.GetLastCount(),
			LastDtype:     c.GetLastDtype(),
			CompletedTime: fromUnixNanos(c.GetCompletedUnixNanos()),
			Error:         c.GetError(),
			ErrorSeq:      c.GetErrorSeq(),
			Wait:          time.Duration(c.GetWaitNanos()),
			// straggler: per-collective waits for the arrival order.
			RecentFirst: c.GetRecentFirst(),
		}
		for _, w := range c.GetRecentWaitNanos() {
			cp.RecentWaits = append(cp.RecentWaits, time.Duration(w))
		}
		if pc := c.GetPending(); pc != nil {
			col := collective(pc)
			cp.Pending = &col
		}
		out.Comms = append(out.Comms, cp)
	}
	out.ProcState, out.Attached = p.GetProcessState(), p.GetAttached()
	out.CommsSource, out.CommsNote = p.GetCommsSource(), p.GetCommsNote()
	out.StepSource = p.GetStepSource()
	if p.CpuPercent != nil {
		out.CPUPercent, out.CPUKnown = finite(p.GetCpuPercent()), true
	}
	out.StepsPerSecond = finite(p.GetStepsPerSecond())
	out.Advanced = fromUnixNanos(p.GetProgressUnixNanos())
	if g := p.GetGpu(); g != nil && g.GetUnixNanos() != 0 {
		out.GPU = job.GPUSample{
			Index: int(g.GetIndex()), UUID: g.GetUuid(), Name: g.GetName(), Time: fromUnixNanos(g.GetUnixNanos()),
			UtilPercent: int(g.GetUtilPercent()), MemoryUsed: g.GetMemoryUsedBytes(), MemoryTotal: g.GetMemoryTotalBytes(),
			PowerW: finite(g.GetPowerWatts()), PowerLimitW: finite(g.GetPowerLimitWatts()),
			TempC: int(g.GetTemperatureC()), SlowdownTempC: int(g.GetSlowdownTemperatureC()), SMClockMHz: int(g.GetSmClockMhz()),
			ThrottleReasons: g.GetThrottleReasons(), XIDErrors: g.GetXidErrors(), LastXID: g.GetLastXid(),
		}
	}
	return out
}

// finite is x, or 0 when a worker sent NaN or an infinity: no rate or
// reading is either, and the state's snapshot (JSON) cannot hold them.
func finite(x float64) float64 {
	if math.IsNaN(x) || math.IsInf(x, 0) {
		return 0
	}
	return x
}

func collective(c *gotrainv1.Collective) job.Collective {
	return job.Collective{Seq: c.GetSeq(), Op: c.GetOp(), DType: c.GetDtype(), Count: c.GetCount(), Root: int(c.GetRoot()),
		ReduceOp: c.GetReduceOp(), State: c.GetState(), Enqueued: fromUnixNanos(c.GetEnqueuedUnixNanos())}
}
