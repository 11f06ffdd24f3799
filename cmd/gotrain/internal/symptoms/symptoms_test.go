package symptoms

import (
	"strings"
	"testing"

	gotrainv1 "github.com/gotrain/gotrain/proto/gotrain/v1"
)

func TestFind(t *testing.T) {
	busy := func(rank, util int) Rank {
		return Rank{Rank: rank, Host: "h", GPU: rank, GPUUtil: util, CPUPercent: 40, CPUKnown: true, StepsPerSecond: 5}
	}
	feeding := func(rank, util int, cpu float64) Rank {
		return Rank{Rank: rank, Host: "h", GPU: rank, GPUUtil: util, CPUPercent: cpu, CPUKnown: true, StepsPerSecond: 2}
	}
	for _, tc := range []struct {
		name  string
		ranks []Rank
		want  []string // "kind rank: part of the text"
	}{
		{"healthy", []Rank{busy(0, 95), busy(1, 93), busy(2, 97)}, nil},
		{"one idle GPU among busy ones", []Rank{busy(0, 95), {Rank: 1, Host: "n2", GPU: 1, GPUUtil: 0, CPUPercent: 100, CPUKnown: true, StepsPerSecond: 0.4}, busy(2, 90)},
			[]string{"cpu-fallback 1: rank 1 on n2: its GPU 1 is idle (0 %) while the other ranks' are busy (median 92 %), its process at 100 % of a CPU: it may be computing on the CPU"}},
		{"idle, CPU unknown", []Rank{busy(0, 95), {Rank: 1, Host: "h", GPU: 1, GPUUtil: 1}}, []string{"cpu-fallback 1: (median 95 %): it may be"}},
		// Every GPU idle: a pause, a hang, or input; not one rank's fallback.
		{"all idle, nothing stepping", []Rank{{Rank: 0, GPU: 0, GPUUtil: 0}, {Rank: 1, GPU: 1, GPUUtil: 0}}, nil},
		{"input-bound", []Rank{feeding(0, 12, 99), feeding(1, 20, 100), feeding(2, 8, 97)},
			[]string{"input-bound -1: the job looks input-bound: its GPUs are mostly idle (median 12 % busy) while its ranks keep a CPU busy (median 99 %) at 2.00 steps/s"}},
		{"GPUs idle, CPUs idle too: not input-bound", []Rank{feeding(0, 12, 5), feeding(1, 20, 3)}, nil},
		{"GPUs busy, CPUs busy", []Rank{feeding(0, 90, 100), feeding(1, 85, 100)}, nil},
		{"no CPU figures", []Rank{{Rank: 0, GPU: 0, GPUUtil: 10, StepsPerSecond: 2}, {Rank: 1, GPU: 1, GPUUtil: 10, StepsPerSecond: 2}}, nil},
		{"no driver", []Rank{{Rank: 0, GPU: 0, GPUUtil: -1, CPUPercent: 100, CPUKnown: true, StepsPerSecond: 3}, {Rank: 1, GPU: 1, GPUUtil: -1}}, nil},
		{"CPU job", []Rank{{Rank: 0, GPU: -1, GPUUtil: -1, CPUPercent: 100, CPUKnown: true, StepsPerSecond: 3}}, nil},
		{"one rank", []Rank{busy(0, 0)}, nil},
		// Both at once: one rank on the CPU does not make the job input-bound
		// while most GPUs are busy.
		{"fallback only", []Rank{feeding(0, 0, 100), feeding(1, 95, 100), feeding(2, 96, 100)}, []string{"cpu-fallback 0: rank 0 on h"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := Find(tc.ranks)
			if len(got) != len(tc.want) {
				t.Fatalf("Find = %+v, want %d finding(s)", got, len(tc.want))
			}
			for i, w := range tc.want {
				head, text, _ := strings.Cut(w, ": ")
				if g := got[i]; g.Kind+" "+itoa(g.Rank) != head || !strings.Contains(g.Text, text) {
					t.Errorf("finding %d = %+v, want %s with %q", i, g, head, text)
				}
			}
		})
	}
}

func itoa(n int) string {
	if n < 0 {
		return "-" + itoa(-n)
	}
	return string(rune('0' + n))
}

func TestFromStatus(t *testing.T) {
	cpu := 97.0
	st := &gotrainv1.JobStatus{Ranks: []*gotrainv1.RankStatus{
		{Rank: 0, Hostname: "a", Gpu: 0, State: "running", Progress: &gotrainv1.RankProgress{StepsPerSecond: 2, CpuPercent: &cpu,
			Gpu: &gotrainv1.GPUSample{UnixNanos: 1, UtilPercent: 7}}},
		{Rank: 1, Hostname: "a", Gpu: 1, State: "running", Progress: &gotrainv1.RankProgress{}},
		{Rank: 2, Hostname: "b", Gpu: 0, State: "exited"},
	}}
	got := FromStatus(st)
	if len(got) != 2 || got[0] != (Rank{Rank: 0, Host: "a", GPU: 0, GPUUtil: 7, CPUPercent: 97, CPUKnown: true, StepsPerSecond: 2}) ||
		got[1] != (Rank{Rank: 1, Host: "a", GPU: 1, GPUUtil: -1}) {
		t.Errorf("FromStatus = %+v", got)
	}
}
