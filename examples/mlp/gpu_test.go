//go:build cuda

package main

import (
	"context"
	"math"
	"os"
	"testing"

	"github.com/gotrain/gotrain/gpu/cudadrv"
	"github.com/gotrain/gotrain/worker"
	"github.com/gotrain/gotrain/worker/ncclcomm/nccltest"
)

// These tests need GPUs: build with `go test -c -tags cuda` and run the
// binary on the GPU machine (make gpu). MLP_PTX names a PTX file to load
// instead of the embedded one.

// skipGPU skips a test that lacks GPU hardware or software, or fails it
// where GOTRAIN_REQUIRE_GPU=1 (the GPU machine: bench/gpu_check.sh), where
// a GPU test that did not run is a missing result.
func skipGPU(t *testing.T, why any) {
	t.Helper()
	if os.Getenv("GOTRAIN_REQUIRE_GPU") == "1" {
		t.Fatalf("GOTRAIN_REQUIRE_GPU=1, so this GPU test must run, but it would skip: %v", why)
	}
	t.Skip(why)
}

func gpuCount(t *testing.T) int {
	t.Helper()
	drv, err := cudadrv.Load()
	if err != nil {
		skipGPU(t, err)
	}
	n, err := drv.DeviceCount()
	if err != nil || n == 0 {
		skipGPU(t, "no GPU")
	}
	return n
}

// ncclComms starts size NCCL ranks in this process, rank r on device r.
func ncclComms(t *testing.T, size int) []worker.Comm {
	cs := make([]worker.Comm, size)
	for r, c := range nccltest.Comms(t, size, "mlp-test") {
		cs[r] = c
	}
	return cs
}

func relDiff(got, want []float32) (worst float64, at int) {
	var scale float64
	for _, v := range want {
		scale = math.Max(scale, math.Abs(float64(v)))
	}
	for i := range want {
		if d := math.Abs(float64(got[i]-want[i])) / scale; d > worst {
			worst, at = d, i
		}
	}
	return worst, at
}

// One GPU step gives the CPU implementation's gradients and weights within
// 1e-4 (relative to the largest magnitude), for each optimizer.
func TestGPUStepMatchesCPU(t *testing.T) {
	gpuCount(t)
	for _, o := range []optim{
		{Kind: "sgd", LR: 0.5},
		{Kind: "momentum", LR: 0.5, Momentum: 0.9},
		{Kind: "adam", LR: 0.01, Beta1: 0.9, Beta2: 0.999, Eps: 1e-8},
	} {
		t.Run(o.Kind, func(t *testing.T) {
			cfg := modelConfig{
				Arch: arch{dims: []int{96, 256, 192, 40}}, Batch: 64, Seed: 3, Optim: o, ChunkBytes: 64 << 10,
				DP: worker.DataParallelConfig{BucketBytes: 64 << 10}, PTXPath: os.Getenv("MLP_PTX"),
			}
			x, y := testBatch(cfg.Arch, cfg.Batch, 4)
			cpu, err := newCPUModel(t.Context(), cpuComms(t, 1)[0], cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer cpu.Close()
			gpu, err := newGPU(t.Context(), ncclComms(t, 1)[0], cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer gpu.Close()
			for step := range 2 {
				for _, m := range []model{cpu, gpu} {
					if err := m.Load(x, y); err != nil {
						t.Fatal(err)
					}
					if err := m.Step(t.Context()); err != nil {
						t.Fatal(err)
					}
				}
				cl, _ := cpu.Loss()
				gl, err := gpu.Loss()
				if err != nil {
					t.Fatal(err)
				}
				if math.Abs(float64(cl-gl)) > 1e-4*math.Abs(float64(cl)) {
					t.Errorf("step %d: loss GPU %v, CPU %v", step, gl, cl)
				}
				cg, _ := cpu.Grads()
				gg, _ := gpu.Grads()
				if d, i := relDiff(gg, cg); d > 1e-4 {
					t.Errorf("step %d: gradient %d: GPU %v, CPU %v (relative %.2g)", step, i, gg[i], cg[i], d)
				}
				cp, _ := cpu.Params()
				gp, _ := gpu.Params()
				if d, i := relDiff(gp, cp); d > 1e-4 {
					t.Errorf("step %d: parameter %d: GPU %v, CPU %v (relative %.2g)", step, i, gp[i], cp[i], d)
				}
			}
		})
	}
}

// After N steps on different data every rank's weights are bitwise the same.
func TestGPURanksIdentical(t *testing.T) {
	n := gpuCount(t)
	if n < 2 {
		skipGPU(t, "needs 2 GPUs")
	}
	for _, tc := range []struct {
		name string
		bf16 bool
		o    optim
		dp   worker.DataParallelConfig
	}{
		{"fp32-sgd-nccl", false, optim{Kind: "sgd", LR: 0.1}, worker.DataParallelConfig{BucketBytes: 64 << 10, Transport: worker.TransportNCCL}},
		{"fp32-sgd-copy-engine", false, optim{Kind: "sgd", LR: 0.1}, worker.DataParallelConfig{BucketBytes: 64 << 10, Transport: worker.TransportCopyEngine}},
		{"adam-copy-engine-fused", false, optim{Kind: "adam", LR: 1e-3, Beta1: 0.9, Beta2: 0.999, Eps: 1e-8}, worker.DataParallelConfig{BucketBytes: 64 << 10, Transport: worker.TransportCopyEngine, FusedSum: true, DeferUpdate: true}},
		{"accum3-momentum-copy-engine", false, optim{Kind: "momentum", LR: 0.05, Momentum: 0.9}, worker.DataParallelConfig{BucketBytes: 64 << 10, AccumulationSteps: 3, Transport: worker.TransportCopyEngine}},
		{"reduce-bf16-accum2-momentum", false, optim{Kind: "momentum", LR: 0.05, Momentum: 0.9}, worker.DataParallelConfig{BucketBytes: 64 << 10, BF16: true, AccumulationSteps: 2}},
		{"bf16-gemm-adam", true, optim{Kind: "adam", LR: 1e-3, Beta1: 0.9, Beta2: 0.999, Eps: 1e-8}, worker.DataParallelConfig{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const size = 2
			cs := ncclComms(t, size)
			final := make([][]float32, size)
			losses := make([][2]float32, size)
			onRanks(t, cs, func(r int, c worker.Comm) error {
				cfg := modelConfig{
					Arch: arch{dims: []int{128, 512, 512, 64}}, Batch: 32, Seed: uint64(20 + r), Optim: tc.o, ChunkBytes: 128 << 10,
					BF16GEMM: tc.bf16, DP: tc.dp, Device: r, PTXPath: os.Getenv("MLP_PTX"),
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
				for s := range 30 {
					if err := m.Step(t.Context()); err != nil {
						return err
					}
					if s == 0 {
						losses[r][0], _ = m.Loss()
					}
				}
				losses[r][1], _ = m.Loss()
				final[r], err = m.Params()
				return err
			})
			for i := range final[0] {
				if math.Float32bits(final[1][i]) != math.Float32bits(final[0][i]) {
					t.Fatalf("parameter %d: rank 1 %v, rank 0 %v", i, final[1][i], final[0][i])
				}
			}
			for r := range size {
				if !(losses[r][1] < losses[r][0]) {
					t.Errorf("rank %d: loss %v -> %v, did not fall", r, losses[r][0], losses[r][1])
				}
			}
			t.Logf("losses %v", losses)
		})
	}
}
