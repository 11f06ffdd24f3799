package jobenv

import (
	"slices"
	"testing"
)

func TestNodeGenerationGPUs(t *testing.T) {
	gen := func(gpus ...int) NodeGeneration {
		var g NodeGeneration
		for i, gpu := range gpus {
			g.Ranks = append(g.Ranks, Assignment{Rank: 4 + i, LocalRank: len(gpus) - 1 - i, GPU: gpu})
		}
		return g
	}
	tests := []struct {
		name string
		g    NodeGeneration
		want []int
	}{
		{"one per GPU, local-rank order", gen(3, 2, 1, 0), []int{0, 1, 2, 3}},
		{"shared GPUs listed once", gen(1, 1, 0, 0), []int{0, 1}},
		{"eight on one", gen(5, 5, 5, 5, 5, 5, 5, 5), []int{5}},
		{"CPU", gen(-1, -1), nil},
	}
	for _, tt := range tests {
		if got := tt.g.GPUs(); !slices.Equal(got, tt.want) {
			t.Errorf("%s: GPUs() = %v, want %v", tt.name, got, tt.want)
		}
	}
}
