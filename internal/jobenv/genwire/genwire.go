// Package genwire converts the coordinator's GenerationStarted message into
// jobenv.NodeGeneration: the one place where a generation on the wire becomes
// the generation that jobenv.Identity builds a rank's identity from. The
// agent and package worker both use it, so that they never read the
// message differently.
package genwire

import (
	"github.com/gotrain/gotrain/internal/jobenv"
	gotrainv1 "github.com/gotrain/gotrain/proto/gotrain/v1"
)

// Generation converts g, the ranks in the order they came.
func Generation(g *gotrainv1.GenerationStarted) jobenv.NodeGeneration {
	out := jobenv.NodeGeneration{
		Number: g.GetGeneration(), WorldSize: int(g.GetWorldSize()), GroupRank: int(g.GetGroupRank()),
		RestartCount: int(g.GetRestartCount()), MasterAddr: g.GetMasterAddr(), MasterPort: int(g.GetMasterPort()),
	}
	for _, r := range g.GetRanks() {
		out.Ranks = append(out.Ranks, jobenv.Assignment{
			Rank: int(r.GetRank()), LocalRank: int(r.GetLocalRank()), GPU: int(r.GetGpu()), Survivor: r.GetSurvivor(),
		})
	}
	return out
}
