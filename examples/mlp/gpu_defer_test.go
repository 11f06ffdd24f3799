//go:build cuda

package main

import (
	"context"
	"math"
	"os"
	"testing"

	"github.com/gotrain/gotrain/worker"
)

// With DeferUpdate (weight gradients first, the optimizer after Release),
// and with FusedSum (the optimizer adds the peer's gradients), the GPU
// weights are bitwise those of the plain order and a separate sum, and the
// same on every rank.
func TestGPUDeferUpdateSameWeights(t *testing.T) {
	n := min(gpuCount(t), 2)
	train := func(dp worker.DataParallelConfig) [][]float32 {
		cs := ncclComms(t, n)
		final := make([][]float32, n)
		onRanks(t, cs, func(r int, c worker.Comm) error {
			cfg := modelConfig{
				Arch: arch{dims: []int{128, 512, 512, 64}}, Batch: 32, Seed: 20, Optim: optim{Kind: "momentum", LR: 0.05, Momentum: 0.9},
				DP: dp, Device: r, PTXPath: os.Getenv("MLP_PTX"),
			}
			m, err := newGPU(context.Background(), c, cfg)
			if err != nil {
				return err
			}
			defer m.Close()
			x, y := testBatch(cfg.Arch, cfg.Batch, uint64(r+1))
			if err := m.Load(x, y); err != nil {
				return err
			}
			for range 20 {
				if err := m.Step(t.Context()); err != nil {
					return err
				}
			}
			final[r], err = m.Params()
			return err
		})
		return final
	}
	plain := worker.DataParallelConfig{BucketBytes: 256 << 10}
	want := train(plain)
	for _, tc := range []struct {
		name            string
		deferUpd, fused bool
	}{{"DeferUpdate", true, false}, {"FusedSum", false, true}, {"DeferUpdate+FusedSum", true, true}} {
		dp := plain
		dp.DeferUpdate, dp.FusedSum = tc.deferUpd, tc.fused
		got := train(dp)
		for r := range n {
			for i := range want[0] {
				if math.Float32bits(got[r][i]) != math.Float32bits(want[r][i]) {
					t.Fatalf("rank %d parameter %d: %v with %s, %v without", r, i, got[r][i], tc.name, want[r][i])
				}
				if math.Float32bits(got[r][i]) != math.Float32bits(got[0][i]) {
					t.Fatalf("%s: rank %d parameter %d: %v, rank 0 %v", tc.name, r, i, got[r][i], got[0][i])
				}
			}
		}
	}
}
