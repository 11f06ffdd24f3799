package explain

import "fmt"

// A rank that runs out of GPU memory at the same point twice will do so
// every time: the same program, batch and GPU need the same memory there.
// The first out-of-memory is restarted (a fragmented allocator, another
// process that held memory for a while); the second at the same point
// ends the job.

// OOMSeen is a CUDA out-of-memory that ended a rank.
type OOMSeen struct {
	Generation int64
	Rank       int
	// Step is the rank's last step its progress reported, -1 when unknown.
	Step int64
	// Where is the traceback position (observe.CUDAOOM.Where), "" when
	// there was no traceback.
	Where string
}

// samePoint says whether a and b ran out of memory at the same point: the
// same step when both know theirs, else the same traceback position.
func (a OOMSeen) samePoint(b OOMSeen) bool {
	if a.Step >= 0 && b.Step >= 0 {
		return a.Step == b.Step
	}
	return a.Where != "" && a.Where == b.Where
}

// RepeatedOOM says why oom can only repeat: an out-of-memory of an
// earlier generation, among seen, happened at the same point; "" when none
// did.
func RepeatedOOM(seen []OOMSeen, oom OOMSeen) string {
	for i := len(seen) - 1; i >= 0; i-- {
		s := seen[i]
		if s.Generation >= oom.Generation || !s.samePoint(oom) {
			continue
		}
		at := "at " + oom.Where
		if s.Step >= 0 && oom.Step >= 0 {
			at = fmt.Sprintf("at step %d", oom.Step)
		}
		return fmt.Sprintf("rank %d ran out of GPU memory in generation %d and rank %d in generation %d, both %s (a batch that does not fit)",
			s.Rank, s.Generation, oom.Rank, oom.Generation, at)
	}
	return ""
}

// MaxOOMSeen bounds the out-of-memory errors an agent remembers.
const MaxOOMSeen = 16
