package ncclras

import (
	"maps"
	"slices"
	"time"
)

// Progress from RAS reports.
//
// RAS knows how many collectives of each function (all-reduce, all-gather,
// ...) every rank has launched; it does not know which completed, nor the
// order of launches of different functions. A Tracker turns successive
// reports into what gotrain's hang detector works from — per rank and
// communicator, the last collective entered and completed and the one
// pending — under these approximations:
//
//   - entered = the collectives the rank launched (the text report: of the
//     functions it lists, those whose counts differ between ranks);
//   - the communicator's agreed count A = the sum over functions of the
//     lowest count any rank has: no rank can finish a collective another
//     rank has not launched, and for the first A every rank launched the
//     same functions; completed = min(entered, A);
//   - the pending collective #A+1 is the function in which the rank is
//     ahead of the lowest rank, when that is a single function (ambiguous
//     otherwise);
//   - a rank that does not answer (stopped, dead) keeps its last counts:
//     counts only grow, so A stays a lower bound;
//   - an asynchronous error or an abort on any rank means the agreed
//     collective did not complete either: completed = min(entered, A) - 1.
//
// So RAS shows ranks that never entered a collective the others launched
// and ranks that launched a different function; a collective every rank
// launched and none finished looks complete unless NCCL reports an error.
//
// A Tracker is not safe for concurrent use.
type Tracker struct {
	comms map[string]*commTrack
}

type commTrack struct {
	agreed      int64
	agreedSet   bool
	agreedAt    time.Time
	ranks       map[int]*rankTrack // by communicator rank; -1: the unnamed ranks (text)
	seen        bool
	othersCount int
	size        int // the largest size seen
}

type rankTrack struct {
	id           Rank
	counts       map[string]int64
	entered      int64
	pendingSince time.Time // when it was first seen ahead of the agreed count
}

// CommView is one communicator's progress as the Tracker derived it.
type CommView struct {
	Hash string
	// Size is the number of ranks: as the JSON report says, or, from text
	// reports, the most ranks they accounted for (named and unnamed).
	Size int
	// Ranks, in communicator rank order; a rank with Rank.Rank -1 stands
	// for the ranks the text report does not name (Others).
	Ranks []RankView
	// OthersCount is how many ranks the view with Rank.Rank -1 stands for.
	OthersCount int
	// Unknown: a rank did not answer and was never seen before, so the
	// agreed count is unknown; Ranks is empty.
	Unknown bool
}

// RankView is one rank's progress in one communicator.
type RankView struct {
	// Rank identifies the rank (communicator rank, host, pid, GPU).
	Rank               Rank
	Entered, Completed int64
	// CompletedAt is when the communicator's agreed count last moved (the
	// Tracker's clock); zero before the first change.
	CompletedAt time.Time
	// Pending: Entered > Completed. PendingOp is the pending collective's
	// function ("allreduce"), "" when the report cannot tell (Ambiguous)
	// or the pending collective is the agreed one that failed.
	Pending   bool
	PendingOp string
	Ambiguous bool
	// PendingSince is when the Tracker first saw the rank ahead.
	PendingSince time.Time
	// Stale: RAS got no answer from the rank; its counts are the last it
	// had.
	Stale bool
	// Error is an NCCL error on the rank ("" if none).
	Error string
}

// NewTracker returns an empty Tracker.
func NewTracker() *Tracker { return &Tracker{comms: map[string]*commTrack{}} }

// Update takes a report, read at now, and returns every communicator it
// shows. Communicators the report no longer shows are forgotten (the text
// report shows a communicator only while its ranks disagree).
func (t *Tracker) Update(now time.Time, st *Status) []CommView {
	for _, c := range t.comms {
		c.seen = false
	}
	var out []CommView
	for _, c := range st.Comms {
		ct := t.comms[c.Hash]
		if ct == nil {
			ct = &commTrack{ranks: map[int]*rankTrack{}}
			t.comms[c.Hash] = ct
		}
		ct.seen = true
		out = append(out, ct.update(now, c, st.Format == "json"))
	}
	maps.DeleteFunc(t.comms, func(_ string, c *commTrack) bool { return !c.seen })
	return out
}

func (ct *commTrack) update(now time.Time, c Comm, complete bool) CommView {
	live, errored := ct.record(c)
	known := ct.markMissing(c.Missing, live)
	if complete {
		// The JSON report lists every rank: one it does not list left the
		// communicator. The text report names only outliers; the others
		// keep their last counts.
		ct.forgetAbsent(live)
	}
	if !known && !ct.agreedSet {
		return CommView{Hash: c.Hash, Size: c.Size, Unknown: true}
	}
	ct.size = max(ct.size, ct.sizeOf(c))
	// The agreed count and the lowest count of each function.
	low := ct.lowestCounts()
	var agreed int64
	for _, n := range low {
		agreed += n
	}
	if !known || len(ct.ranks) == 0 {
		agreed = ct.agreed
	}
	ct.setAgreed(now, agreed)
	v := CommView{Hash: c.Hash, Size: ct.size, OthersCount: ct.othersCount}
	for _, r := range slices.Sorted(maps.Keys(ct.ranks)) {
		v.Ranks = append(v.Ranks, ct.view(now, r, c.Ranks, low, errored))
	}
	return v
}

// record takes the counts of the ranks the report names and of the unnamed
// others (text), and says which ranks it heard from and whether any has an
// error or was aborted.
func (ct *commTrack) record(c Comm) (live map[int]bool, errored bool) {
	live = map[int]bool{}
	for _, r := range c.Ranks {
		ct.set(r, r.Counts)
		live[r.Rank] = true
		if r.Error != "" || r.Aborted {
			errored = true
		}
	}
	if c.Others != nil && c.OthersCount > 0 {
		ct.set(Rank{Rank: -1, Pid: -1, CudaDev: -1, NvmlDev: -1}, c.Others)
		live[-1] = true
	} else {
		delete(ct.ranks, -1)
	}
	ct.othersCount = max(c.OthersCount, 0)
	return live, errored
}

// set replaces rank id's counts with those of the report.
func (ct *commTrack) set(id Rank, counts map[string]int64) {
	rt := ct.ranks[id.Rank]
	if rt == nil {
		rt = &rankTrack{}
		ct.ranks[id.Rank] = rt
	}
	rt.id = id
	rt.counts = maps.Clone(counts)
	rt.entered = 0
	for _, n := range counts {
		rt.entered += n
	}
}

// markMissing keeps the last counts of the ranks that did not answer and
// counts them live; it reports false when one was never seen, which leaves
// the agreed count where it was.
func (ct *commTrack) markMissing(missing []Rank, live map[int]bool) (known bool) {
	known = true
	for _, r := range missing {
		rt := ct.ranks[r.Rank]
		if rt == nil || rt.counts == nil {
			known = false
			continue
		}
		rt.id.Unresponsive, rt.id.Dead = r.Unresponsive, r.Dead
		live[r.Rank] = true
	}
	return known
}

// forgetAbsent drops the ranks not in live.
func (ct *commTrack) forgetAbsent(live map[int]bool) {
	for r := range ct.ranks {
		if !live[r] {
			delete(ct.ranks, r)
		}
	}
}

// sizeOf is the communicator's size: as the report says, or the ranks it
// accounts for (named and unnamed).
func (ct *commTrack) sizeOf(c Comm) int {
	if c.Size != 0 {
		return c.Size
	}
	size := len(ct.ranks) + ct.othersCount
	if _, ok := ct.ranks[-1]; ok {
		size--
	}
	return size
}

// lowestCounts is, per function, the lowest count of the ranks that report
// it.
func (ct *commTrack) lowestCounts() map[string]int64 {
	low := map[string]int64{}
	for _, rt := range ct.ranks {
		for f, n := range rt.counts {
			// A function a rank does not report (a report from another
			// NCCL version, or a rank the text report left out of f)
			// does not lower it.
			if cur, ok := low[f]; !ok || n < cur {
				low[f] = n
			}
		}
	}
	return low
}

// setAgreed moves the agreed count, noting when it changed and restarting
// every rank's pending clock: the pending collective is another one now.
func (ct *commTrack) setAgreed(now time.Time, agreed int64) {
	if ct.agreedSet && agreed == ct.agreed {
		return
	}
	if ct.agreedSet {
		ct.agreedAt = now
	}
	for _, rt := range ct.ranks {
		rt.pendingSince = time.Time{}
	}
	ct.agreed, ct.agreedSet = agreed, true
}

// view is rank r's progress; reported are the ranks that answered.
func (ct *commTrack) view(now time.Time, r int, reported []Rank, low map[string]int64, errored bool) RankView {
	rt := ct.ranks[r]
	rv := RankView{Rank: rt.id, Entered: rt.entered, CompletedAt: ct.agreedAt, Stale: !slices.ContainsFunc(reported, func(x Rank) bool { return x.Rank == r }) && r >= 0}
	rv.Completed = min(rt.entered, ct.agreed)
	if errored && rv.Completed > 0 {
		rv.Completed--
	}
	rv.Error = rankError(reported, r)
	if rv.Entered <= rv.Completed {
		rt.pendingSince = time.Time{}
		return rv
	}
	rv.Pending = true
	switch ahead := rt.ahead(low); {
	case errored:
		// The pending collective is the agreed one, whose function
		// the counts do not tell.
	case len(ahead) == 1:
		rv.PendingOp = ahead[0]
	case len(ahead) > 1:
		rv.Ambiguous = true
	}
	if rt.pendingSince.IsZero() {
		rt.pendingSince = now
	}
	rv.PendingSince = rt.pendingSince
	return rv
}

// rankError is the error the report gives rank r: NCCL's, or the abort.
func rankError(reported []Rank, r int) string {
	var err string
	for _, x := range reported {
		if x.Rank == r {
			err = x.Error
			if x.Aborted && err == "" {
				err = "communicator aborted"
			}
		}
	}
	return err
}

// ahead lists the functions in which the rank is past the lowest count.
func (rt *rankTrack) ahead(low map[string]int64) []string {
	var ahead []string
	for f, n := range rt.counts {
		if n > low[f] {
			ahead = append(ahead, f)
		}
	}
	return ahead
}
