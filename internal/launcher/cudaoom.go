package launcher

import (
	"fmt"

	"github.com/gotrain/gotrain/internal/launcher/explain"
	"github.com/gotrain/gotrain/internal/launcher/observe"
	gotrainv1 "github.com/gotrain/gotrain/proto/gotrain/v1"
)

// examineCUDAOOM adds to the exit report req of p, a rank that exited
// (not by a signal), what the node knows when its stderr says it ran out
// of GPU memory: the GPU's memory and who holds it now, and, when an
// earlier generation's rank here ran out at the same point, that the
// failure can only repeat (explain/oomrepeat.go).
func (a *agent) examineCUDAOOM(req *gotrainv1.ReportWorkerExitRequest, p *workerProc) {
	oom, ok := observe.FindCUDAOOM(req.StderrTail)
	if !ok {
		return
	}
	nv, err := openNVML()
	if err == nil {
		defer nv.Close()
	}
	req.Notes = append(req.Notes, observe.GPUMemoryNote(nv, err, p.gpu, a.whose))
	// The step it ended in: the hook's record, read now (the last progress
	// report may be a second old), else the last one reported.
	step, known := int64(-1), false
	if a.hub != nil {
		step, known = a.hub.Torch().StepsOf(int(req.GetPid())) // observe/torchprogress.go
		if !known {
			step, known = a.hub.LastStep(req.GetGeneration(), int(req.GetRank())) // relay/progress.go
		}
	}
	if !known {
		step = -1
	}
	seen := explain.OOMSeen{Generation: req.GetGeneration(), Rank: int(req.GetRank()), Step: step, Where: oom.Where()}
	if why := explain.RepeatedOOM(a.ooms, seen); why != "" && !a.cfg.RetryPermanent {
		req.Permanent, req.Repeated = why, true
	}
	a.ooms = append(a.ooms, seen)
	if len(a.ooms) > explain.MaxOOMSeen {
		a.ooms = a.ooms[len(a.ooms)-explain.MaxOOMSeen:]
	}
}

// whose names a process of this node by pid for a note: a rank, gotrain's
// standby; "" for one that is neither.
func (a *agent) whose(pid int) string {
	for _, p := range a.reg.procs {
		if p.pid() != pid {
			continue
		}
		if p.who.Standby {
			if p.py != nil {
				return fmt.Sprintf("gotrain's Python standby for slot %d", p.who.Slot)
			}
			return fmt.Sprintf("gotrain's standby for slot %d", p.who.Slot)
		}
		return fmt.Sprintf("rank %d of this job", p.who.Rank)
	}
	return ""
}
