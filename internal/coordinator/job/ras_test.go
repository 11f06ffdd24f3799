package job_test

import (
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/cockroachdb/datadriven"

	"github.com/gotrain/gotrain/internal/coordinator/job"
	"github.com/gotrain/gotrain/internal/ncclras"
)

// Transcripts of PyTorch-style jobs (testdata/ras/): ranks that never attach,
// whose progress the agent derives from NCCL RAS reports
// (internal/launcher/observe/raspoll.go). They add one command to the hang detector's:
//
//	ras id=ID gen=G file=F pids=(RANK:PID, ...) [state=(RANK:S, ...)]
//	        reads the RAS report internal/ncclras/testdata/F through the
//	        transcript's Tracker (at its clock), maps RAS ranks to gotrain
//	        ranks by pid and reports them, unattached, for node ID.
//
// The mapping to CommProgress mirrors internal/launcher/rasCommProgress, which
// internal/launcher/raspoll_test.go checks on the wire.
func (e *env) rasReport(t *testing.T, d *datadriven.TestData) string {
	var id, file string
	var gen int64
	var pids, states []string
	d.ScanArgs(t, "id", &id)
	d.ScanArgs(t, "gen", &gen)
	d.ScanArgs(t, "file", &file)
	d.ScanArgs(t, "pids", &pids)
	d.MaybeScanArgs(t, "state", &states)
	raw, err := os.ReadFile(filepath.Join("..", "..", "ncclras", "testdata", file))
	if err != nil {
		t.Fatal(err)
	}
	format := "text"
	if strings.HasSuffix(file, ".json") {
		format = "json"
	}
	st, err := ncclras.ParseStatus(format, string(raw))
	if err != nil {
		d.Fatalf(t, "%v", err)
	}
	rankOf := map[int]int{} // by pid
	progress := map[int]*job.Progress{}
	for _, kv := range pids {
		r, pid := rankPair(t, d, kv)
		p, err := strconv.Atoi(pid)
		if err != nil {
			d.Fatalf(t, "pids: %v", err)
		}
		rankOf[p] = r
		progress[r] = &job.Progress{Rank: r, Generation: gen, Pid: p, ProcState: "S", Time: e.now, CommsSource: "nccl-ras"}
	}
	for _, kv := range states {
		r, s := rankPair(t, d, kv)
		progress[r].ProcState = s
	}
	for _, v := range e.ras.Update(e.now, st) {
		for _, rv := range v.Ranks {
			r, ok := rankOf[rv.Rank.Pid]
			if !ok || v.Unknown {
				continue
			}
			c := job.CommProgress{Comm: v.Hash, EnteredSeq: rv.Entered, CompletedSeq: rv.Completed, CompletedTime: rv.CompletedAt, Error: rv.Error}
			if rv.Error != "" {
				c.ErrorSeq = rv.Completed + 1
			}
			if rv.Pending && !rv.Ambiguous && (rv.PendingOp != "" || rv.Error != "") {
				c.Pending = &job.Collective{Seq: rv.Completed + 1, Op: rv.PendingOp, Root: -1, State: "enqueued", Enqueued: rv.PendingSince}
				if rv.Error != "" {
					c.Pending.State = "failed"
				}
			}
			progress[r].Comms = append(progress[r].Comms, c)
		}
	}
	ev := job.ProgressReported{NodeID: id}
	for _, r := range slices.Sorted(maps.Keys(progress)) {
		ev.Ranks = append(ev.Ranks, *progress[r])
	}
	return e.step(ev)
}

// rankPair splits "RANK:X".
func rankPair(t *testing.T, d *datadriven.TestData, kv string) (int, string) {
	r, x, _ := strings.Cut(kv, ":")
	rank, err := strconv.Atoi(r)
	if err != nil {
		d.Fatalf(t, "want RANK:X, not %q", kv)
	}
	return rank, x
}
