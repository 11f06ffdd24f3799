package worker

import (
	"context"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/gotrain/gotrain/worker/comm"
	"github.com/gotrain/gotrain/worker/cpucomm"
	"github.com/gotrain/gotrain/worker/cpucomm/cpucommtest"
)

// cpuRanks starts size ranks of the CPU backend in this process.
func cpuRanks(t *testing.T, size int) []Comm {
	t.Helper()
	var comms []Comm
	for _, c := range cpucommtest.Ranks(t, cpucomm.Config{Name: "dp", Generation: 1}, size) {
		comms = append(comms, c)
	}
	return comms
}

// onRanks runs f on every rank concurrently and fails the test on errors.
func onRanks(t *testing.T, comms []Comm, f func(r int, c Comm) error) {
	t.Helper()
	errs := make([]error, len(comms))
	var wg sync.WaitGroup
	for r, c := range comms {
		wg.Go(func() { errs[r] = f(r, c) })
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
}

// countingComm counts the all-reduces of the Comm it wraps.
type countingComm struct {
	Comm
	allReduces atomic.Int64
}

func (c *countingComm) AllReduce(ctx context.Context, send, recv Buffer, op Op) error {
	c.allReduces.Add(1)
	return c.Comm.AllReduce(ctx, send, recv, op)
}

func TestDataParallelBuckets(t *testing.T) {
	// Reverse order: p3 (7) + p2 (5) + p1 (20) reach 15 elements; p0 alone.
	sizes := []int{10, 20, 5, 7}
	tests := []struct {
		bucketBytes int
		want        []Bucket
	}{
		{4 * 15, []Bucket{{First: 3, Last: 1, Offset: 0, Len: 32}, {First: 0, Last: 0, Offset: 32, Len: 10}}},
		{4 * 7, []Bucket{{First: 3, Last: 3, Offset: 0, Len: 7}, {First: 2, Last: 1, Offset: 7, Len: 25}, {First: 0, Last: 0, Offset: 32, Len: 10}}},
		{4, []Bucket{{First: 3, Last: 3, Offset: 0, Len: 7}, {First: 2, Last: 2, Offset: 7, Len: 5}, {First: 1, Last: 1, Offset: 12, Len: 20}, {First: 0, Last: 0, Offset: 32, Len: 10}}},
		{0, []Bucket{{First: 3, Last: 0, Offset: 0, Len: 42}}},
	}
	for _, tt := range tests {
		grads := make([]float32, 42)
		dp, err := NewDataParallel(t.Context(), cpuRanks(t, 1)[0], sizes, Host(grads), DataParallelConfig{BucketBytes: tt.bucketBytes})
		if err != nil {
			t.Fatal(err)
		}
		if got := dp.Buckets(); !slices.Equal(got, tt.want) {
			t.Errorf("bucket bytes %d: buckets %v, want %v", tt.bucketBytes, got, tt.want)
		}
		wantOff := []int{32, 12, 7, 0}
		for i, w := range wantOff {
			if dp.Offset(i) != w || dp.Grad(i).Len() != sizes[i] {
				t.Errorf("param %d: offset %d len %d, want %d %d", i, dp.Offset(i), dp.Grad(i).Len(), w, sizes[i])
			}
		}
		dp.Close()
	}
}

func TestDataParallelConfigErrors(t *testing.T) {
	c := cpuRanks(t, 1)[0]
	after := func(Bucket, uintptr) error { return nil }
	for _, tc := range []struct {
		sizes []int
		grads Buffer
		cfg   DataParallelConfig
	}{
		{[]int{4}, Host(make([]float32, 4)), DataParallelConfig{Transport: TransportCopyEngine}}, // host gradients
		{[]int{4}, Host(make([]float32, 4)), DataParallelConfig{Transport: Transport(7)}},
		{[]int{4}, Host(make([]float32, 4)), DataParallelConfig{Transport: TransportCopyEngine, BF16: true, AfterReduce: after}},
		{[]int{4}, Host(make([]float32, 4)), DataParallelConfig{FusedSum: true}}, // no AfterReduce to add
		{[]int{3}, Host(make([]float32, 4)), DataParallelConfig{}},
		{[]int{0, 4}, Host(make([]float32, 4)), DataParallelConfig{}},
		{[]int{4}, Host(make([]float64, 4)), DataParallelConfig{}},
		{[]int{4}, Host(make([]float32, 4)), DataParallelConfig{BucketBytes: -1}},
		{[]int{4}, comm.Device(1<<20, 4, Float32), DataParallelConfig{}}, // device buffers need NCCL
	} {
		if _, err := NewDataParallel(t.Context(), c, tc.sizes, tc.grads, tc.cfg); err == nil {
			t.Errorf("NewDataParallel(%v, %v, %+v) succeeded", tc.sizes, tc.grads.DType(), tc.cfg)
		}
	}
}

func TestParseTransport(t *testing.T) {
	for _, tr := range []Transport{TransportAuto, TransportNCCL, TransportCopyEngine} {
		if got, err := ParseTransport(tr.String()); err != nil || got != tr {
			t.Errorf("ParseTransport(%q) = %v, %v", tr.String(), got, err)
		}
	}
	if _, err := ParseTransport("nvlink"); err == nil || !strings.Contains(err.Error(), "auto, nccl or copy-engine") {
		t.Errorf("ParseTransport(nvlink): %v, want an error naming the choices", err)
	}
}

// Host gradients have no transport of their own (the communicator's
// collectives move them): Transport says auto.
func TestDataParallelHostTransport(t *testing.T) {
	dp, err := NewDataParallel(t.Context(), cpuRanks(t, 1)[0], []int{4}, Host(make([]float32, 4)), DataParallelConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer dp.Close()
	if got := dp.Transport(); got != TransportAuto {
		t.Errorf("Transport() = %v, want auto", got)
	}
}

// A bucket's reduction starts when its last gradient is ready, before
// Finish, and buckets are reduced in order even when marked out of order.
func TestDataParallelReducesEarly(t *testing.T) {
	comms := cpuRanks(t, 2)
	sizes := []int{4, 4, 4}
	onRanks(t, comms, func(r int, c Comm) error {
		cc := &countingComm{Comm: c}
		grads := make([]float32, 12)
		dp, err := NewDataParallel(t.Context(), cc, sizes, Host(grads), DataParallelConfig{BucketBytes: 16})
		if err != nil {
			return err
		}
		defer dp.Close()
		ctx := t.Context()
		if err := dp.Ready(ctx, 0); err != nil { // the last bucket: must wait
			return err
		}
		if n := cc.allReduces.Load(); n != 0 {
			t.Errorf("rank %d: %d all-reduces after the last bucket alone was ready, want 0", r, n)
		}
		if err := dp.Ready(ctx, 2); err != nil {
			return err
		}
		if err := dp.Ready(ctx, 1); err != nil {
			return err
		}
		// All three are launched now; Finish waits for them.
		if _, err := dp.Finish(ctx); err != nil {
			return err
		}
		if n := cc.allReduces.Load(); n != 3 {
			t.Errorf("rank %d: %d all-reduces, want 3", r, n)
		}
		return nil
	})
}

func TestDataParallelAverage(t *testing.T) {
	for _, size := range []int{1, 2, 3, 4} {
		comms := cpuRanks(t, size)
		sizes := []int{100, 3000, 7, 20000} // the ring path of cpucomm too
		total := 23107
		onRanks(t, comms, func(r int, c Comm) error {
			grads := make([]float32, total)
			dp, err := NewDataParallel(t.Context(), c, sizes, Host(grads), DataParallelConfig{BucketBytes: 4096})
			if err != nil {
				return err
			}
			defer dp.Close()
			for step := range 3 {
				for i := range grads {
					// Integers: every summation order gives the same sum.
					grads[i] = float32((i%97)*(r+1) + step)
				}
				for p := len(sizes) - 1; p >= 0; p-- {
					if err := dp.Ready(t.Context(), p); err != nil {
						return err
					}
				}
				synced, err := dp.Finish(t.Context())
				if err != nil {
					return err
				}
				if !synced {
					t.Errorf("rank %d: Finish did not sync without accumulation", r)
				}
				ranksum := float64(size * (size + 1) / 2)
				for i, g := range grads {
					want := float32((float64(i%97)*ranksum + float64(step*size)) / float64(size))
					if g != want {
						t.Fatalf("size %d rank %d step %d: grad[%d] = %v, want %v", size, r, step, i, g, want)
					}
				}
			}
			return nil
		})
	}
}

func TestDataParallelAccumulation(t *testing.T) {
	const k = 3
	comms := cpuRanks(t, 2)
	sizes := []int{5, 6}
	onRanks(t, comms, func(r int, c Comm) error {
		cc := &countingComm{Comm: c}
		grads := make([]float32, 11)
		dp, err := NewDataParallel(t.Context(), cc, sizes, Host(grads), DataParallelConfig{AccumulationSteps: k, BucketBytes: 4})
		if err != nil {
			return err
		}
		defer dp.Close()
		for window := range 2 {
			for micro := range k {
				if dp.MicroStep() != micro || dp.Syncing() != (micro == k-1) {
					t.Errorf("rank %d: micro-step %d, syncing %v; want %d, %v", r, dp.MicroStep(), dp.Syncing(), micro, micro == k-1)
				}
				for i := range grads {
					g := float32(8 * (r + 1) * (micro + 1)) // rank r's micro-batch gradient
					if micro == 0 {
						grads[i] = g
					} else {
						grads[i] += g
					}
				}
				if err := dp.ReadyAll(t.Context()); err != nil {
					return err
				}
				synced, err := dp.Finish(t.Context())
				if err != nil {
					return err
				}
				if synced != (micro == k-1) {
					t.Errorf("rank %d: micro-step %d synced %v", r, micro, synced)
				}
				if want := int64(2 * (window + boolInt(synced))); cc.allReduces.Load() != want {
					t.Errorf("rank %d: %d all-reduces after micro-step %d of window %d, want %d", r, cc.allReduces.Load(), micro, window, want)
				}
			}
			// mean over 2 ranks × 3 micro-steps of 8(r+1)(m+1): 8 × 1.5 × 2 = 24
			for i, g := range grads {
				if g != 24 {
					t.Fatalf("rank %d window %d: grad[%d] = %v, want 24", r, window, i, g)
				}
			}
		}
		if n := cc.allReduces.Load(); n != 4 {
			t.Errorf("rank %d: %d all-reduces in 2 windows of 2 buckets, want 4", r, n)
		}
		return nil
	})
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

func TestRoundBF16(t *testing.T) {
	ulp := float32(1.0 / 128) // bfloat16 spacing at 1 (7 stored mantissa bits)
	tests := []struct{ in, want float32 }{
		{1, 1},
		{1 + ulp, 1 + ulp},
		{1 + ulp/2, 1},                      // tie: to even (1)
		{1 + 3*ulp/2, 1 + 2*ulp},            // tie: to even (1+2ulp)
		{1 + ulp/2 + ulp/64, 1 + ulp},       // above the tie
		{-(1 + ulp/2 + ulp/64), -(1 + ulp)}, // sign
		{3.14159265, 3.140625},              // π
		{math.MaxFloat32, float32(math.Inf(1))},
		{float32(math.Inf(-1)), float32(math.Inf(-1))},
	}
	for _, tt := range tests {
		if got := RoundBF16(tt.in); got != tt.want {
			t.Errorf("RoundBF16(%v) = %v, want %v", tt.in, got, tt.want)
		}
	}
	// Subnormals round on the same bit grid as normal numbers.
	sub := math.Float32frombits(0x00018000) // exactly a tie between 0x0001 and 0x0002 (×2^16)
	if got := math.Float32bits(RoundBF16(sub)); got != 0x00020000 {
		t.Errorf("RoundBF16(tie subnormal) bits %#x, want 0x00020000", got)
	}
	if nan := RoundBF16(float32(math.NaN())); nan == nan {
		t.Error("RoundBF16(NaN) is not NaN")
	}
	// Every result is representable: its low 16 bits are zero.
	rng := rand.New(rand.NewPCG(1, 2))
	for range 10000 {
		v := math.Float32frombits(rng.Uint32())
		if math.IsNaN(float64(v)) {
			continue
		}
		r := RoundBF16(v)
		if math.Float32bits(r)&0xffff != 0 {
			t.Fatalf("RoundBF16(%v) = %v has low bits set", v, r)
		}
		// Same sign, at most half a bfloat16 step (0x8000 in float32 bits) away.
		if d := int64(math.Float32bits(r)) - int64(math.Float32bits(v)); !math.IsInf(float64(r), 0) && (d > 0x8000 || d < -0x8000) {
			t.Fatalf("RoundBF16(%v) = %v: off by more than half a bfloat16 ulp", v, r)
		}
	}
}

// With BF16 the ranks' gradients are rounded, summed and the sum rounded
// again: a result the float32 reduction would not give.
func TestDataParallelBF16(t *testing.T) {
	comms := cpuRanks(t, 2)
	ulp := float32(1.0 / 128)
	// rank 0: 1, rank 1: ulp/2 (exact in bf16). Sum 1+ulp/2 is a tie: bf16 keeps 1.
	// Rank 0 also contributes a value that bf16 must round first: 1+ulp/4 → 1.
	onRanks(t, comms, func(r int, c Comm) error {
		grads := []float32{1, 1 + ulp/4, 3}
		if r == 1 {
			grads = []float32{ulp / 2, 0, 5}
		}
		dp, err := NewDataParallel(t.Context(), c, []int{3}, Host(grads), DataParallelConfig{BF16: true})
		if err != nil {
			return err
		}
		defer dp.Close()
		if err := dp.ReadyAll(t.Context()); err != nil {
			return err
		}
		if _, err := dp.Finish(t.Context()); err != nil {
			return err
		}
		want := []float32{0.5, 0.5, 4}
		if !slices.Equal(grads, want) {
			t.Errorf("rank %d: bf16-reduced %v, want %v (float32 would give [%v %v 4])", r, grads, want, (1+ulp/2)/2, (1+ulp/4)/2)
		}
		return nil
	})
}

// Ranks that start from different weights and see different data end with
// bitwise identical weights: rank 0's weights are broadcast, and every rank
// applies the same averaged gradients.
func TestDataParallelParamsIdentical(t *testing.T) {
	const size, steps = 3, 20
	comms := cpuRanks(t, size)
	sizes := []int{8 * 4, 4, 4 * 2, 2} // a 8→4→2 linear model, forward order
	total := 46
	final := make([][]float32, size)
	onRanks(t, comms, func(r int, c Comm) error {
		rng := rand.New(rand.NewPCG(uint64(r), 7))
		params := make([]float32, total)
		for i := range params {
			params[i] = rng.Float32() - 0.5 // different on every rank
		}
		grads := make([]float32, total)
		dp, err := NewDataParallel(t.Context(), c, sizes, Host(grads), DataParallelConfig{BucketBytes: 40})
		if err != nil {
			return err
		}
		defer dp.Close()
		if err := dp.BroadcastParams(t.Context(), Host(params)); err != nil {
			return err
		}
		for range steps {
			for i := range grads {
				// Stands in for backward: depends on this rank's data and the weights.
				grads[i] = params[i]*rng.Float32() + float32(r) - 1
			}
			for p := len(sizes) - 1; p >= 0; p-- {
				if err := dp.Ready(t.Context(), p); err != nil {
					return err
				}
			}
			if _, err := dp.Finish(t.Context()); err != nil {
				return err
			}
			for i := range params {
				params[i] -= 0.1 * grads[i]
			}
		}
		final[r] = params
		return nil
	})
	for r := 1; r < size; r++ {
		for i := range final[0] {
			if math.Float32bits(final[r][i]) != math.Float32bits(final[0][i]) {
				t.Fatalf("rank %d param %d = %v, rank 0 has %v", r, i, final[r][i], final[0][i])
			}
		}
	}
}

func TestDataParallelMisuse(t *testing.T) {
	c := cpuRanks(t, 1)[0]
	dp, err := NewDataParallel(t.Context(), c, []int{2, 2}, Host(make([]float32, 4)), DataParallelConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer dp.Close()
	if _, err := dp.Finish(t.Context()); err == nil {
		t.Error("Finish before every parameter was ready succeeded")
	}
	if err := dp.Ready(t.Context(), 2); err == nil {
		t.Error("Ready(2) of 2 parameters succeeded")
	}
	if err := dp.Ready(t.Context(), 1); err != nil {
		t.Fatal(err)
	}
	if err := dp.Ready(t.Context(), 1); err == nil {
		t.Error("Ready twice succeeded")
	}
}
