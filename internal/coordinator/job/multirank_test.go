package job

import (
	"errors"
	"slices"
	"testing"
	"time"
)

// Several ranks per GPU (NCCL 2.30's multi-rank-per-GPU): a node may run
// up to RanksPerGPU workers per GPU, and contiguous local ranks share one.
func TestRanksPerGPU(t *testing.T) {
	gpus := func(n int) []GPU {
		var out []GPU
		for i := range n {
			out = append(out, GPU{Index: 10 + i})
		}
		return out
	}
	tests := []struct {
		name        string
		nproc, gpus int
		perGPU      int
		want        []int // each local rank's GPU index; nil: the join is refused
	}{
		{"one per GPU", 2, 4, 0, []int{10, 11}},
		{"two per GPU", 4, 2, 2, []int{10, 10, 11, 11}},
		{"eight on one", 8, 1, 8, []int{10, 10, 10, 10, 10, 10, 10, 10}},
		{"three on two", 3, 2, 2, []int{10, 10, 11}},
		{"too many", 3, 1, 2, nil},
		{"too many without it", 2, 1, 0, nil},
		{"negative", 1, 1, -1, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, err := New(Config{RunID: "r"})
			if err != nil {
				t.Fatal(err)
			}
			acts, err := m.Step(time.Unix(0, 0), NodeJoined{NodeID: "a", Info: NodeInfo{Hostname: "a", Address: "a", Nproc: tt.nproc, GPUs: gpus(tt.gpus), RanksPerGPU: tt.perGPU, FreePort: 1}})
			if tt.want == nil {
				if !errors.Is(err, ErrInvalidEvent) {
					t.Fatalf("join = %v, want ErrInvalidEvent", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var got []int
			for _, a := range acts {
				if sg, ok := a.(StartGeneration); ok {
					for _, r := range sg.Nodes[0].Ranks {
						got = append(got, r.GPU)
					}
				}
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("GPUs of the local ranks = %v, want %v", got, tt.want)
			}
		})
	}
}
