package main

import (
	"strings"
	"testing"
	"time"

	gotrainv1 "github.com/gotrain/gotrain/proto/gotrain/v1"
)

// The verdict's own collective is quoted (#3, where the job is stuck), not
// the ranks' latest progress (rank 0 already waits in #4 of another comm),
// with the stall measured to now rather than frozen at detection.
func TestPrintDiagnosisQuotesVerdictCollective(t *testing.T) {
	now := time.Unix(1000, 0)
	d := &gotrainv1.DiagnoseResponse{
		NowUnixNanos: now.UnixNano(),
		Status: &gotrainv1.JobStatus{RunId: "r", State: "running", WorldSize: 2,
			Verdicts: []*gotrainv1.HangVerdict{{Kind: "never-entered", Comm: "grads",
				Collective:            &gotrainv1.Collective{Seq: 3, Op: "allreduce", Dtype: "float32", ReduceOp: "sum", Count: 1024},
				LastProgressUnixNanos: now.Add(-150 * time.Second).UnixNano(),
				Summary:               `rank 1 never entered allreduce #3 of comm "grads"; rank 0 waits in it for 2m0s`,
				Waiting:               []int32{0}}},
			Ranks: []*gotrainv1.RankStatus{{Rank: 0, Progress: &gotrainv1.RankProgress{Comms: []*gotrainv1.CommProgress{
				{Comm: "other", EnteredSeq: 4, CompletedSeq: 3, Pending: &gotrainv1.Collective{Seq: 4, Op: "broadcast"}}}}}},
		},
	}
	var b strings.Builder
	printDiagnosis(&b, d, 0)
	want := `  collective: allreduce #3 float32 sum 1024 of comm "grads", stalled 2m30s, ranks 0 waiting in it` + "\n"
	if !strings.Contains(b.String(), "VERDICT [never-entered]") || !strings.Contains(b.String(), want) {
		t.Errorf("printDiagnosis:\n%s\nwant a line %q", b.String(), want)
	}
}

// A job whose GPUs idle while its ranks keep a CPU busy between steps is
// called input-bound, with the fixes.
func TestPrintDiagnosisNamesInputBound(t *testing.T) {
	cpu := 99.0
	rank := func(r int32) *gotrainv1.RankStatus {
		return &gotrainv1.RankStatus{Rank: r, Hostname: "a", Gpu: r, State: "running", Progress: &gotrainv1.RankProgress{
			StepsPerSecond: 1.5, CpuPercent: &cpu, Gpu: &gotrainv1.GPUSample{UnixNanos: 1, UtilPercent: 9}}}
	}
	d := &gotrainv1.DiagnoseResponse{NowUnixNanos: time.Unix(1000, 0).UnixNano(),
		Status: &gotrainv1.JobStatus{RunId: "r", State: "running", WorldSize: 2, Ranks: []*gotrainv1.RankStatus{rank(0), rank(1)}}}
	var b strings.Builder
	printDiagnosis(&b, d, 0)
	if !strings.Contains(b.String(), "note: the job looks input-bound: its GPUs are mostly idle (median 9 % busy) while its ranks keep a CPU busy (median 99 %) at 1.50 steps/s") ||
		!strings.Contains(b.String(), "num_workers, pin_memory=True") {
		t.Errorf("printDiagnosis:\n%s", b.String())
	}
}
