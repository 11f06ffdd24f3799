package jobenv

import "slices"

// A rank's identity is built in one place, Identity, from the generation the
// coordinator started and the facts of the node; the agent uses it for a
// fresh worker's environment, and package worker for a standby that takes a
// rank over and for a survivor that recovers in process, so that all three
// see the same variables.

// NodeGeneration is one generation of the job as this node sees it: the job-wide
// numbers and the ranks that run on this node (GenerationStarted on the wire;
// package genwire converts it).
type NodeGeneration struct {
	Number       int64
	WorldSize    int
	GroupRank    int // this node's rank among the nodes
	RestartCount int
	MasterAddr   string
	MasterPort   int
	Ranks        []Assignment // this node's ranks, in local-rank order
}

// Assignment is one rank of a generation on this node.
type Assignment struct {
	Rank, LocalRank int
	GPU             int // index on the node, -1 for none (the CPU backend)
	// Survivor: the rank's process of the previous generation keeps running
	// it (in-process recovery).
	Survivor bool
}

// Node is what a worker is told about its node and job, the same for every
// rank of the node.
type Node struct {
	AgentSocket string
	JobToken    string
	RunID       string
	Backend     string
	Host        string
}

// Node returns the node facts of v.
func (v Vars) Node() Node {
	return Node{AgentSocket: v.AgentSocket, JobToken: v.JobToken, RunID: v.RunID, Backend: v.Backend, Host: v.Host}
}

// Node returns the node facts of a standby.
func (v StandbyVars) Node() Node {
	return Node{AgentSocket: v.AgentSocket, JobToken: v.JobToken, RunID: v.RunID, Backend: v.Backend, Host: v.Host}
}

// Assignment returns rank's assignment in g; false when rank does not run
// on this node in g.
func (g NodeGeneration) Assignment(rank int) (Assignment, bool) {
	i := slices.IndexFunc(g.Ranks, func(a Assignment) bool { return a.Rank == rank })
	if i < 0 {
		return Assignment{}, false
	}
	return g.Ranks[i], true
}

// RankAt returns the rank of local rank local in g; false when the node
// runs no such local rank.
func (g NodeGeneration) RankAt(local int) (int, bool) {
	i := slices.IndexFunc(g.Ranks, func(a Assignment) bool { return a.LocalRank == local })
	if i < 0 {
		return 0, false
	}
	return g.Ranks[i].Rank, true
}

// GPUs returns the GPUs of g's ranks in local-rank order, each once (ranks
// that share a GPU, NCCL's multi-rank-per-GPU, list it once: CUDA sees no device at
// all when CUDA_VISIBLE_DEVICES names one twice — torch.cuda.device_count()
// is 0 with "0,0" on an H200, bench/results/multirank-2026-12-02.md), nil when they have none
// (the CPU backend) or the local ranks are not 0..n-1.
func (g NodeGeneration) GPUs() []int {
	gpus := make([]int, len(g.Ranks))
	for _, r := range g.Ranks {
		if r.GPU < 0 || r.LocalRank < 0 || r.LocalRank >= len(gpus) {
			return nil
		}
		gpus[r.LocalRank] = r.GPU
	}
	out := gpus[:0]
	for _, gpu := range gpus {
		if !slices.Contains(out, gpu) {
			out = append(out, gpu)
		}
	}
	return out
}

// Identity is rank's identity in generation g on node n: the variables a
// worker of that rank gets, however its process came to be. It reports
// false when rank does not run on this node in g.
func Identity(g NodeGeneration, rank int, n Node) (Vars, bool) {
	a, ok := g.Assignment(rank)
	if !ok {
		return Vars{}, false
	}
	return Vars{
		Rank: a.Rank, WorldSize: g.WorldSize,
		LocalRank: a.LocalRank, LocalWorldSize: len(g.Ranks),
		GroupRank: g.GroupRank, Generation: g.Number, RestartCount: g.RestartCount,
		AgentSocket: n.AgentSocket, JobToken: n.JobToken, RunID: n.RunID,
		Backend: n.Backend, Host: n.Host, GPU: a.GPU,
		MasterAddr: g.MasterAddr, MasterPort: g.MasterPort,
	}, true
}
