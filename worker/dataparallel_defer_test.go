package worker

import (
	"context"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
)

// signalComm signals on started when its nth all-reduce (1-based) starts.
type signalComm struct {
	Comm
	mu      sync.Mutex
	calls   int
	nth     int
	started chan struct{}
}

func (c *signalComm) AllReduce(ctx context.Context, send, recv Buffer, op Op) error {
	c.mu.Lock()
	c.calls++
	if c.calls == c.nth {
		c.started <- struct{}{}
	}
	c.mu.Unlock()
	return c.Comm.AllReduce(ctx, send, recv, op)
}

// With DeferUpdate a bucket's AfterReduce waits for the release of its
// parameters: one released before the bucket is ready updates right after
// the reduction, one released later updates at the release, one never
// released updates at Finish.
func TestDataParallelDeferUpdateOrder(t *testing.T) {
	for _, tc := range []struct {
		deferUpdate bool
		atSecond    []int // buckets updated (first) when the second reduction starts
		want        []int // buckets in the order of their updates
	}{
		{false, []int{0}, []int{0, 1, 2}},
		{true, nil, []int{0, 2, 1}},
	} {
		comms := cpuRanks(t, 2)
		onRanks(t, comms, func(r int, c Comm) error {
			sc := &signalComm{Comm: c, nth: 2, started: make(chan struct{}, 1)}
			var mu sync.Mutex
			var updates []int
			cfg := DataParallelConfig{BucketBytes: 16, DeferUpdate: tc.deferUpdate}
			grads := make([]float32, 12)
			var dp *DataParallel
			cfg.AfterReduce = func(b Bucket, _ uintptr) error {
				mu.Lock()
				defer mu.Unlock()
				// Buckets: 0 is parameter 2, 1 is 1, 2 is 0.
				updates = append(updates, 2-b.First)
				return nil
			}
			dp, err := NewDataParallel(t.Context(), sc, []int{4, 4, 4}, Host(grads), cfg)
			if err != nil {
				return err
			}
			defer dp.Close()
			ctx := t.Context()
			steps := []func() error{
				func() error { return dp.Release(ctx, 0) }, // bucket 2, before it is ready
				func() error { return dp.Ready(ctx, 2) },   // bucket 0
				func() error { return dp.Ready(ctx, 1) },   // bucket 1
			}
			for _, f := range steps {
				if err := f(); err != nil {
					return err
				}
			}
			<-sc.started // bucket 0's job is over, its update included if any
			mu.Lock()
			// Without DeferUpdate bucket 1's update may follow at once.
			if len(updates) < len(tc.atSecond) || !slices.Equal(updates[:len(tc.atSecond)], tc.atSecond) || (tc.deferUpdate && len(updates) != 0) {
				t.Errorf("defer %t rank %d: updates %v when bucket 1's reduction starts, want %v", tc.deferUpdate, r, updates, tc.atSecond)
			}
			mu.Unlock()
			if err := dp.Release(ctx, 2); err != nil { // bucket 0, after its launch
				return err
			}
			if err := dp.Ready(ctx, 0); err != nil { // bucket 2, released before
				return err
			}
			if _, err := dp.Finish(ctx); err != nil { // releases bucket 1
				return err
			}
			if !slices.Equal(updates, tc.want) {
				t.Errorf("defer %t rank %d: updates %v, want %v", tc.deferUpdate, r, updates, tc.want)
			}
			return nil
		})
	}
}

// A step with DeferUpdate, releases in any order and gradient accumulation
// gives bitwise the parameters of the plain step, on every rank.
func TestDataParallelDeferUpdateSameResult(t *testing.T) {
	const size, steps = 2, 12
	sizes := []int{8 * 4, 4, 4 * 2, 2} // a 8→4→2 linear model, forward order
	total := 46
	run := func(deferUpdate bool, accum int, releaseOrder []int) [][]float32 {
		comms := cpuRanks(t, size)
		final := make([][]float32, size)
		onRanks(t, comms, func(r int, c Comm) error {
			rng := rand.New(rand.NewPCG(uint64(r), 7))
			params := make([]float32, total)
			for i := range params {
				params[i] = float32(i%7) * 0.25
			}
			grads := make([]float32, total)
			cfg := DataParallelConfig{BucketBytes: 40, AccumulationSteps: accum, DeferUpdate: deferUpdate}
			cfg.AfterReduce = func(b Bucket, _ uintptr) error {
				for i := b.Offset; i < b.Offset+b.Len; i++ {
					params[i] -= 0.1 * grads[i]
				}
				return nil
			}
			dp, err := NewDataParallel(t.Context(), c, sizes, Host(grads), cfg)
			if err != nil {
				return err
			}
			defer dp.Close()
			for range steps * accum {
				first := dp.MicroStep() == 0
				for p := len(sizes) - 1; p >= 0; p-- {
					g := grads[dp.Offset(p) : dp.Offset(p)+sizes[p]]
					for i := range g {
						// Stands in for backward: reads the weights.
						v := params[dp.Offset(p)+i]*rng.Float32() + float32(r) - 1
						if first {
							g[i] = v
						} else {
							g[i] += v
						}
					}
					if err := dp.Ready(t.Context(), p); err != nil {
						return err
					}
				}
				for _, p := range releaseOrder {
					if err := dp.Release(t.Context(), p); err != nil {
						return err
					}
				}
				if _, err := dp.Finish(t.Context()); err != nil {
					return err
				}
			}
			final[r] = params
			return nil
		})
		return final
	}
	want := run(false, 1, nil)
	for _, tc := range []struct {
		accum   int
		release []int
	}{
		{1, nil},
		{1, []int{3, 2, 1, 0}},
		{1, []int{0, 3, 1}},
		{2, []int{2, 0, 1, 3}},
	} {
		got := run(true, tc.accum, tc.release)
		if tc.accum != 1 {
			want = run(false, tc.accum, nil)
		}
		for r := range size {
			for i := range want[0] {
				if math.Float32bits(got[r][i]) != math.Float32bits(want[r][i]) {
					t.Fatalf("accum %d release %v: rank %d param %d = %v, want %v", tc.accum, tc.release, r, i, got[r][i], want[r][i])
				}
				if math.Float32bits(got[r][i]) != math.Float32bits(got[0][i]) {
					t.Fatalf("accum %d release %v: rank %d param %d = %v, rank 0 %v", tc.accum, tc.release, r, i, got[r][i], got[0][i])
				}
			}
		}
	}
}

func TestDataParallelReleaseMisuse(t *testing.T) {
	c := cpuRanks(t, 1)[0]
	for _, deferUpdate := range []bool{false, true} {
		dp, err := NewDataParallel(t.Context(), c, []int{2, 2}, Host(make([]float32, 4)), DataParallelConfig{DeferUpdate: deferUpdate})
		if err != nil {
			t.Fatal(err)
		}
		if err := dp.Release(t.Context(), 2); err == nil {
			t.Errorf("defer %t: Release(2) of 2 parameters succeeded", deferUpdate)
		}
		if err := dp.Release(t.Context(), 1); err != nil {
			t.Fatal(err)
		}
		if err := dp.Release(t.Context(), 1); (err == nil) == deferUpdate {
			t.Errorf("defer %t: Release twice: %v", deferUpdate, err)
		}
		dp.Close()
	}
}
