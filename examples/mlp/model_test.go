package main

import (
	"context"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"

	"github.com/gotrain/gotrain/worker"
	"github.com/gotrain/gotrain/worker/comm/commtest"
	"github.com/gotrain/gotrain/worker/cpucomm"
)

// onRanks runs f for every rank at once and fails the test with the first
// failing rank's error.
func onRanks(t *testing.T, cs []worker.Comm, f func(r int, c worker.Comm) error) {
	t.Helper()
	errs := make([]error, len(cs))
	var wg sync.WaitGroup
	for r, c := range cs {
		wg.Go(func() { errs[r] = f(r, c) })
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
}

// trainSteps runs steps steps of m, rank r's batch of step s drawn with
// seed 100r+s.
func trainSteps(ctx context.Context, m model, a arch, batch, r, steps int) error {
	for s := range steps {
		x, y := testBatch(a, batch, uint64(100*r+s))
		if err := m.Load(x, y); err != nil {
			return err
		}
		if err := m.Step(ctx); err != nil {
			return err
		}
	}
	return nil
}

// cpuComms starts size CPU-backend ranks in this process.
func cpuComms(t *testing.T, size int) []worker.Comm {
	t.Helper()
	store := commtest.NewMemStore()
	cs := make([]worker.Comm, size)
	errs := make([]error, size)
	var wg sync.WaitGroup
	for r := range size {
		wg.Go(func() {
			cs[r], errs[r] = cpucomm.New(t.Context(), cpucomm.Config{Name: "mlp", Generation: 1, Rank: r, Size: size, Host: "127.0.0.1", Store: store})
		})
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	t.Cleanup(func() {
		for _, c := range cs {
			c.Close()
		}
	})
	return cs
}

// testBatch returns rows random inputs and labels for a.
func testBatch(a arch, rows int, seed uint64) ([]float32, []int32) {
	rng := rand.New(rand.NewPCG(seed, 3))
	x := make([]float32, rows*a.dims[0])
	for i := range x {
		x[i] = float32(rng.NormFloat64())
	}
	y := make([]int32, rows)
	for i := range y {
		y[i] = int32(rng.IntN(a.dims[len(a.dims)-1]))
	}
	return x, y
}

func smallConfig(batch int) modelConfig {
	return modelConfig{
		Arch: arch{dims: []int{12, 16, 8, 5}}, Batch: batch, Seed: 5, ChunkBytes: 256, // W0: 3 uneven chunks, W1: 2
		Optim: optim{Kind: "sgd", LR: 0}, DP: worker.DataParallelConfig{BucketBytes: 256},
	}
}

// The CPU model's gradients match finite differences of its loss.
func TestCPUGradient(t *testing.T) {
	cfg := smallConfig(6)
	m, err := newCPUModel(t.Context(), cpuComms(t, 1)[0], cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	x, y := testBatch(cfg.Arch, cfg.Batch, 1)
	if err := m.Load(x, y); err != nil {
		t.Fatal(err)
	}
	if err := m.Step(t.Context()); err != nil { // lr 0: the parameters stay
		t.Fatal(err)
	}
	grads, _ := m.Grads()
	loss := func() float64 {
		m.forward(cfg.Batch)
		L := cfg.Arch.layers()
		k := cfg.Arch.dims[L]
		scratch := make([]float32, k)
		var s float64
		for r := range cfg.Batch {
			s += softmaxXent(m.acts[L][r*k:(r+1)*k], int(y[r]), scratch, 1)
		}
		return s / float64(cfg.Batch)
	}
	const eps = 1e-2
	for i := 0; i < len(m.params); i += 7 {
		p := m.params[i]
		m.params[i] = p + eps
		up := loss()
		m.params[i] = p - eps
		down := loss()
		m.params[i] = p
		num := (up - down) / (2 * eps)
		if d := math.Abs(num - float64(grads[i])); d > 2e-3+0.02*math.Abs(num) {
			t.Errorf("param %d: gradient %v, finite difference %v", i, grads[i], num)
		}
	}
}

// Ranks that see different data keep bitwise identical weights, with every
// optimizer, accumulation and bf16 reduction.
func TestCPURanksIdentical(t *testing.T) {
	for _, tc := range []struct {
		name  string
		optim optim
		dp    worker.DataParallelConfig
	}{
		{"sgd", optim{Kind: "sgd", LR: 0.1}, worker.DataParallelConfig{BucketBytes: 256}},
		{"momentum-accum", optim{Kind: "momentum", LR: 0.1, Momentum: 0.9}, worker.DataParallelConfig{BucketBytes: 256, AccumulationSteps: 2}},
		{"adam-bf16", optim{Kind: "adam", LR: 0.01, Beta1: 0.9, Beta2: 0.999, Eps: 1e-8}, worker.DataParallelConfig{BF16: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cs := cpuComms(t, 3)
			final := make([][]float32, len(cs))
			onRanks(t, cs, func(r int, c worker.Comm) error {
				cfg := smallConfig(4)
				cfg.Optim, cfg.DP, cfg.Seed = tc.optim, tc.dp, uint64(10+r) // rank 0's weights win
				m, err := newCPUModel(context.Background(), c, cfg)
				if err != nil {
					return err
				}
				defer m.Close()
				if err := trainSteps(t.Context(), m, cfg.Arch, 4, r, 8); err != nil {
					return err
				}
				final[r], _ = m.Params()
				return nil
			})
			moved := false
			for r := 1; r < len(cs); r++ {
				for i := range final[0] {
					if math.Float32bits(final[r][i]) != math.Float32bits(final[0][i]) {
						t.Fatalf("rank %d param %d = %v, rank 0 has %v", r, i, final[r][i], final[0][i])
					}
				}
			}
			init := make([]float32, len(final[0]))
			m, _ := newCPUModel(t.Context(), cpuComms(t, 1)[0], smallConfig(4))
			initParams(m.a, init, m.dp.Offset, 10)
			m.Close()
			for i := range init {
				moved = moved || init[i] != final[0][i]
			}
			if !moved {
				t.Error("training did not change the weights")
			}
		})
	}
}

// Training on a learnable synthetic task lowers the loss.
func TestArchChunks(t *testing.T) {
	a := arch{dims: []int{12, 16, 8, 5}}.withChunks(256, 0)
	if want := []int{3, 2, 1}; !slices.Equal(a.split, want) {
		t.Fatalf("split %v, want %v", a.split, want)
	}
	// forward order: W0 chunks 2,1,0 (4,6,6 rows), b0, W1 chunks 1,0, b1, W2, b2
	if got, want := a.sizes(), []int{4 * 12, 6 * 12, 6 * 12, 16, 4 * 16, 4 * 16, 8, 5 * 8, 5}; !slices.Equal(got, want) {
		t.Errorf("sizes %v, want %v", got, want)
	}
	if a.wIndex(0, 0) != 2 || a.bIndex(0) != 3 || a.wIndex(1, 1) != 4 || a.bIndex(2) != 8 {
		t.Error("wrong parameter indices")
	}
	if a.numParams() != 12*16+16+16*8+8+8*5+5 {
		t.Errorf("%d parameters", a.numParams())
	}
}

func TestCPULearns(t *testing.T) {
	cfg := smallConfig(32)
	cfg.Optim = optim{Kind: "momentum", LR: 0.1, Momentum: 0.9}
	m, err := newCPUModel(t.Context(), cpuComms(t, 1)[0], cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	x, y := testBatch(cfg.Arch, 32, 9)
	if err := m.Load(x, y); err != nil {
		t.Fatal(err)
	}
	var first, last float32
	for s := range 200 {
		if err := m.Step(t.Context()); err != nil {
			t.Fatal(err)
		}
		if s == 0 {
			first, _ = m.Loss()
		}
	}
	last, _ = m.Loss()
	if !(last < first/4) {
		t.Errorf("loss %v -> %v after 200 steps on one batch", first, last)
	}
}

// --chunk-first-mb splits only the first layer's weight; --chunk-mb the
// others unless the first has its own size.
func TestChunksFirstLayer(t *testing.T) {
	a := arch{dims: []int{12, 16, 8, 5}}
	for _, tc := range []struct {
		chunk, first int
		want         []int
	}{
		{0, 0, []int{1, 1, 1}},
		{0, 192, []int{4, 1, 1}}, // W_0: 16×12×4 = 768 bytes
		{256, 0, []int{3, 2, 1}},
		{256, 384, []int{2, 2, 1}},
	} {
		got := a.withChunks(tc.chunk, tc.first)
		for l, w := range tc.want {
			if got.chunks(l) != w {
				t.Errorf("withChunks(%d, %d): layer %d has %d chunks, want %d", tc.chunk, tc.first, l, got.chunks(l), w)
			}
		}
	}
}
