package top

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"testing"
	"time"

	gotrainv1 "github.com/gotrain/gotrain/proto/gotrain/v1"
)

var rewrite = flag.Bool("rewrite", false, "rewrite the golden files in testdata/")

var now = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

func ago(d time.Duration) int64 { return now.Add(-d).UnixNano() }

// status is a job of four ranks: rank 1 is stuck in a collective on a hot
// GPU, rank 2 is slower than rank 0 (a straggler verdict names it), rank 3 runs a program that does not
// report its progress, rank 4 is a PyTorch program whose optimizer steps
// gotrain's hook counts, on an idle GPU while its process keeps a CPU busy
// (it computes on the CPU).
func status() *gotrainv1.JobStatus {
	gpu := func(i int32, temp int32, throttle uint64) *gotrainv1.GPUSample {
		return &gotrainv1.GPUSample{Index: i, Uuid: "GPU-" + string(rune('a'+i)), Name: "NVIDIA H200", UnixNanos: ago(400 * time.Millisecond),
			UtilPercent: 95, MemoryUsedBytes: 70 << 30, MemoryTotalBytes: 140 << 30, PowerWatts: 610, PowerLimitWatts: 700,
			TemperatureC: temp, SlowdownTemperatureC: 87, SmClockMhz: 1980, ThrottleReasons: throttle}
	}
	idle := gpu(0, 40, 0)
	idle.UtilPercent, idle.MemoryUsedBytes = 0, 500<<20
	busyCPU, someCPU := 100.0, 45.0
	done := func(seq int64) []*gotrainv1.CommProgress {
		return []*gotrainv1.CommProgress{{Comm: "dp", EnteredSeq: seq, CompletedSeq: seq, LastOp: "allreduce", LastDtype: "float32", LastCount: 1024, CompletedUnixNanos: ago(time.Second)}}
	}
	return &gotrainv1.JobStatus{RunId: "run-1", State: "running", Generation: 2, WorldSize: 5, RestartCount: 1, Ranks: []*gotrainv1.RankStatus{
		{Rank: 0, Hostname: "a", Gpu: 0, State: "running", Progress: &gotrainv1.RankProgress{
			Pid: 100, ProcessState: "R", Attached: true, Step: 120, StepsPerSecond: 5, SamplesPerSecond: 640, CpuPercent: &someCPU,
			ProgressUnixNanos: ago(300 * time.Millisecond), Comms: done(120), Gpu: gpu(0, 70, 0)}},
		{Rank: 1, Hostname: "a", Gpu: 1, State: "running", Progress: &gotrainv1.RankProgress{
			Pid: 101, ProcessState: "S", Attached: true, Step: 39, ProgressUnixNanos: ago(12 * time.Second),
			Comms: []*gotrainv1.CommProgress{{Comm: "dp", EnteredSeq: 40, CompletedSeq: 39, LastOp: "allreduce",
				Pending: &gotrainv1.Collective{Seq: 40, Op: "allreduce", Dtype: "float32", Count: 1024, State: "started", EnqueuedUnixNanos: ago(12 * time.Second)}}},
			Gpu: gpu(1, 91, 0x40|0x20)}},
		{Rank: 2, Hostname: "b", Gpu: 0, State: "running", Progress: &gotrainv1.RankProgress{
			Pid: 200, ProcessState: "R", Attached: true, Step: 118, StepsPerSecond: 2,
			ProgressUnixNanos: ago(800 * time.Millisecond), Comms: done(118), Gpu: gpu(0, 60, 0x4)}},
		{Rank: 3, Hostname: "b", Gpu: -1, State: "running", Progress: &gotrainv1.RankProgress{Pid: 201, ProcessState: "R"}},
		{Rank: 4, Hostname: "c", Gpu: 0, State: "running", Progress: &gotrainv1.RankProgress{
			Pid: 300, ProcessState: "R", StepSource: "torch-hook", Step: 57, StepsPerSecond: 3, ProgressUnixNanos: ago(500 * time.Millisecond),
			CpuPercent: &busyCPU, Gpu: idle}},
	}, Verdicts: []*gotrainv1.HangVerdict{{Kind: "straggler", Comm: "dp", Culprits: []*gotrainv1.Culprit{{Rank: 2}},
		Straggler: &gotrainv1.StragglerFigures{Slower: 1.5, LastShare: 0.9, Common: 10}}}}
}

func TestOrderSlowestFirst(t *testing.T) {
	snap := Build(status(), now)
	var got []int
	for _, r := range snap.Ranks {
		got = append(got, r.Rank)
	}
	want := []int{1, 2, 4, 0, 3}
	if len(got) != len(want) {
		t.Fatalf("ranks %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("order %v, want %v (stuck first, then the slower, unknown last)", got, want)
		}
	}
	r1 := snap.Ranks[0]
	if r1.LastCollective == nil || r1.LastCollective.State != "waiting" || r1.LastCollective.Seq != 40 || r1.LastCollective.WaitingSeconds != 12 {
		t.Errorf("rank 1's last collective = %+v", r1.LastCollective)
	}
	if g := r1.GPUSample; g == nil || !g.ThrottledThermally || g.ThrottledPower {
		t.Errorf("rank 1's GPU = %+v, want thermally throttled", g)
	}
	if r := snap.Ranks[2]; r.Rank != 4 || r.SinceProgressSeconds == nil || r.StepsPerSecond != 3 || r.Step != 57 {
		t.Errorf("rank 4 (steps from the PyTorch hook) = %+v", r)
	}
	if r := snap.Ranks[4]; r.SinceProgressSeconds != nil || r.GPUSample != nil || r.LastCollective != nil {
		t.Errorf("rank 3 does not report, yet has %+v", r)
	}
}

func TestGolden(t *testing.T) {
	snap := Build(status(), now)
	var table bytes.Buffer
	if err := snap.WriteTable(&table); err != nil {
		t.Fatal(err)
	}
	js, err := json.MarshalIndent(snap, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	for name, got := range map[string][]byte{"top.txt": table.Bytes(), "top.json": append(js, '\n')} {
		path := filepath.Join("testdata", name)
		if *rewrite {
			if err := os.WriteFile(path, got, 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		want, err := os.ReadFile(path)
		if err != nil {
			t.Fatalf("%v (run go test -rewrite to create it)", err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s differs (go test -rewrite updates it after a deliberate change):\ngot:\n%s\nwant:\n%s", name, got, want)
		}
	}
}

func TestEmptyJob(t *testing.T) {
	snap := Build(&gotrainv1.JobStatus{RunId: "r", State: "waiting"}, now)
	js, err := json.Marshal(snap)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(js, []byte(`"ranks":[]`)) {
		t.Errorf("a job without ranks should have an empty list, not null: %s", js)
	}
}
