package main

import (
	"context"
	"math"
	"testing"

	"github.com/gotrain/gotrain/worker"
)

// trainRanks trains cfg for steps on size CPU ranks (rank r on its own data)
// and returns every rank's final weights.
func trainRanks(t *testing.T, size, steps int, cfg modelConfig) [][]float32 {
	t.Helper()
	cs := cpuComms(t, size)
	final := make([][]float32, size)
	onRanks(t, cs, func(r int, c worker.Comm) error {
		m, err := newCPUModel(context.Background(), c, cfg)
		if err != nil {
			return err
		}
		defer m.Close()
		if err := trainSteps(t.Context(), m, cfg.Arch, cfg.Batch, r, steps); err != nil {
			return err
		}
		final[r], err = m.Params()
		return err
	})
	return final
}

// With DeferUpdate backward computes each weight gradient before the input
// gradient and the optimizer waits for Release: the weights are bitwise
// those of the plain order, on every rank (run with -race: the optimizer
// runs on DataParallel's goroutine while backward reads the weights).
func TestCPUDeferUpdateSameWeights(t *testing.T) {
	for _, tc := range []struct {
		name  string
		optim optim
		dp    worker.DataParallelConfig
	}{
		{"sgd", optim{Kind: "sgd", LR: 0.1}, worker.DataParallelConfig{BucketBytes: 256}},
		{"momentum-accum", optim{Kind: "momentum", LR: 0.1, Momentum: 0.9}, worker.DataParallelConfig{BucketBytes: 256, AccumulationSteps: 2}},
		{"adam-one-bucket", optim{Kind: "adam", LR: 0.01, Beta1: 0.9, Beta2: 0.999, Eps: 1e-8}, worker.DataParallelConfig{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := smallConfig(4)
			cfg.Optim, cfg.DP = tc.optim, tc.dp
			want := trainRanks(t, 2, 8, cfg)
			cfg.DP.DeferUpdate = true
			got := trainRanks(t, 2, 8, cfg)
			moved := false
			for r := range got {
				for i := range want[0] {
					if math.Float32bits(got[r][i]) != math.Float32bits(want[r][i]) {
						t.Fatalf("rank %d param %d = %v with DeferUpdate, %v without", r, i, got[r][i], want[r][i])
					}
					if math.Float32bits(got[r][i]) != math.Float32bits(got[0][i]) {
						t.Fatalf("rank %d param %d = %v, rank 0 %v", r, i, got[r][i], got[0][i])
					}
				}
			}
			init := trainRanks(t, 1, 0, cfg)[0]
			for i := range init {
				moved = moved || init[i] != got[0][i]
			}
			if !moved {
				t.Error("the weights did not change")
			}
		})
	}
}
