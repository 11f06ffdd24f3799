package job_test

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/datadriven"

	"github.com/gotrain/gotrain/internal/coordinator/job"
)

// The hang detector's transcript commands (see [commands]):
//
//	report id=ID gen=G rank=R [pid=P] [state=S] [at=+D]
//	       [comm=NAME entered=E completed=C [done-at=+D] [wait=D]
//	        [op=OP] [dtype=T] [count=N] [root=R] [redop=O] [since=+D] [error=TEXT]]
//	                        a rank's progress with one communicator. A rank
//	                        with entered > completed has collective
//	                        completed+1 pending: op (default allreduce)
//	                        entered at since.
//	verdicts                the verdicts in force
//	suspect                 what Diagnose would say now
//	evidence id=ID verdict=V rank=R [kind=K] [text=T]

func (e *env) report(t *testing.T, d *datadriven.TestData) string {
	var id string
	p := job.Progress{Time: e.now, ProcState: "S", Attached: true}
	d.ScanArgs(t, "id", &id)
	d.ScanArgs(t, "gen", &p.Generation)
	d.ScanArgs(t, "rank", &p.Rank)
	p.Pid = 1000 + p.Rank
	d.MaybeScanArgs(t, "pid", &p.Pid)
	d.MaybeScanArgs(t, "state", &p.ProcState)
	scanOffset(t, d, "at", &p.Time)
	if d.HasArg("comm") {
		p.Comms = []job.CommProgress{scanComm(t, d, p.Time)}
	}
	return e.step(job.ProgressReported{NodeID: id, Ranks: []job.Progress{p}})
}

// scanComm reads report's comm arguments; the pending collective was entered
// at (unless since says otherwise).
func scanComm(t *testing.T, d *datadriven.TestData, at time.Time) job.CommProgress {
	var c job.CommProgress
	d.ScanArgs(t, "comm", &c.Comm)
	d.ScanArgs(t, "entered", &c.EnteredSeq)
	d.ScanArgs(t, "completed", &c.CompletedSeq)
	d.MaybeScanArgs(t, "error", &c.Error)
	d.MaybeScanArgs(t, "wait", &c.Wait)
	scanOffset(t, d, "done-at", &c.CompletedTime)
	pend := job.Collective{Seq: c.CompletedSeq + 1, Op: "allreduce", DType: "float32", Count: 1024, Root: -1, State: "started", Enqueued: at}
	d.MaybeScanArgs(t, "op", &pend.Op)
	if pend.Op == "allreduce" || pend.Op == "reducescatter" {
		pend.ReduceOp = "sum"
	}
	d.MaybeScanArgs(t, "redop", &pend.ReduceOp)
	d.MaybeScanArgs(t, "dtype", &pend.DType)
	d.MaybeScanArgs(t, "count", &pend.Count)
	d.MaybeScanArgs(t, "root", &pend.Root)
	scanOffset(t, d, "since", &pend.Enqueued)
	if c.Error != "" {
		pend.State = "failed"
		c.ErrorSeq = pend.Seq
	}
	if c.EnteredSeq > c.CompletedSeq {
		c.Pending = &pend
	}
	return c
}

// scanOffset reads key, a time written as +D since transcriptT0, into dst if
// it is given.
func scanOffset(t *testing.T, d *datadriven.TestData, key string, dst *time.Time) {
	var off time.Duration
	if d.MaybeScanArgs(t, key, &off) {
		*dst = transcriptT0.Add(off)
	}
}

func (e *env) verdicts(t *testing.T, d *datadriven.TestData) string {
	var out []string
	for _, v := range e.m.Verdicts() {
		out = append(out, formatVerdict("Verdict", v)...)
	}
	if len(out) == 0 {
		return "no verdicts"
	}
	return strings.Join(out, "\n")
}

func (e *env) suspect(t *testing.T, d *datadriven.TestData) string {
	var out []string
	for _, v := range e.m.Suspected(e.now) {
		out = append(out, formatVerdict("Suspected", v)...)
	}
	if len(out) == 0 {
		return "nothing suspected"
	}
	return strings.Join(out, "\n")
}

func (e *env) evidence(t *testing.T, d *datadriven.TestData) string {
	var ev job.EvidenceReported
	x := job.Evidence{Kind: "goroutines"}
	d.ScanArgs(t, "id", &ev.NodeID)
	d.ScanArgs(t, "verdict", &ev.VerdictID)
	d.ScanArgs(t, "rank", &x.Rank)
	x.Pid = 1000 + x.Rank
	d.MaybeScanArgs(t, "kind", &x.Kind)
	d.MaybeScanArgs(t, "text", &x.Text)
	ev.Evidence = []job.Evidence{x}
	return e.step(ev)
}

func formatHang(a job.HangDetected) []string {
	out := formatVerdict("HangDetected", a.Verdict)
	if a.PostMortem {
		out[0] += " post-mortem"
	}
	for _, t := range a.Collect {
		out = append(out, fmt.Sprintf("  collect %s:%v", t.NodeID, t.Ranks))
	}
	return out
}

func formatVerdict(what string, v job.Verdict) []string {
	out := []string{
		fmt.Sprintf("%s id=%d kind=%s gen=%d comm=%s at=%q since=+%s detected=+%s waiting=%v",
			what, v.ID, v.Kind, v.Generation, v.Comm, collectiveName(v.Collective), v.Since.Sub(transcriptT0), v.Detected.Sub(transcriptT0), v.Waiting),
		"  summary: " + v.Summary,
	}
	for _, c := range v.Culprits {
		coll := "-"
		if c.Collective != nil {
			coll = collectiveName(*c.Collective)
		}
		out = append(out, fmt.Sprintf("  culprit rank=%d node=%s host=%s pid=%d gpu=%d/%s state=%s collective=%q",
			c.Rank, c.NodeID, c.Hostname, c.Pid, c.GPU, c.GPUUUID, strconv.Quote(c.ProcState), coll))
	}
	for _, d := range v.Details {
		out = append(out, "  detail: "+d)
	}
	for _, e := range v.Evidence {
		out = append(out, fmt.Sprintf("  evidence rank=%d pid=%d kind=%s text=%q", e.Rank, e.Pid, e.Kind, e.Text))
	}
	return out
}

// collectiveName is "allreduce #3 (float32 sum, 1024 elements)", or
// "collective #3" when the op is unknown.
func collectiveName(c job.Collective) string {
	if c.Op == "" {
		return fmt.Sprintf("collective #%d", c.Seq)
	}
	op, rest, _ := strings.Cut(c.Shape(), " ")
	return strings.TrimSpace(fmt.Sprintf("%s #%d %s", op, c.Seq, rest))
}
