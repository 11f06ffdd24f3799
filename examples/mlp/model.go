package main

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"

	"github.com/gotrain/gotrain/worker"
)

// arch is the network: dims[0] inputs, dims[len-1] classes, ReLU between
// the linear layers. Layer l has weights W_l (dims[l+1]×dims[l], row-major,
// as PyTorch's Linear) and bias b_l. Each W_l is split into split[l] row
// chunks (1 when split is nil), each its own DataParallel parameter, so that
// the all-reduce of a large weight starts while its gradient is still being
// computed. Parameters in forward order, per layer: W_l's chunks from the
// last to the first, then b_l; DataParallel's reverse layout then keeps W_l
// contiguous and in row order, after b_l.
type arch struct {
	dims  []int
	split []int
}

func (a arch) layers() int   { return len(a.dims) - 1 }
func (a arch) in(l int) int  { return a.dims[l] }
func (a arch) out(l int) int { return a.dims[l+1] }

// chunks returns the number of row chunks of W_l.
func (a arch) chunks(l int) int {
	if l >= len(a.split) || a.split[l] < 1 {
		return 1
	}
	return a.split[l]
}

// chunkRows returns the rows [r0, r1) of W_l in chunk k.
func (a arch) chunkRows(l, k int) (r0, r1 int) {
	per := (a.out(l) + a.chunks(l) - 1) / a.chunks(l)
	return k * per, min(a.out(l), (k+1)*per)
}

func (a arch) base(l int) int {
	b := 0
	for j := range l {
		b += a.chunks(j) + 1
	}
	return b
}

// wIndex is the parameter index of chunk k of W_l; bIndex that of b_l.
func (a arch) wIndex(l, k int) int { return a.base(l) + a.chunks(l) - 1 - k }
func (a arch) bIndex(l int) int    { return a.base(l) + a.chunks(l) }

// withChunks returns a with every weight split into chunks of about
// chunkBytes (no split when chunkBytes is 0), except the first layer's,
// which firstBytes splits when it is not 0: backward computes that weight's
// gradient last, so its all-reduce is the one nothing overlaps, and only
// splitting it shortens the end of the step without making the large
// GEMMs of the other layers smaller (and slower).
func (a arch) withChunks(chunkBytes, firstBytes int) arch {
	a.split = make([]int, a.layers())
	for l := range a.split {
		n, bytes := 1, chunkBytes
		if l == 0 && firstBytes > 0 {
			bytes = firstBytes
		}
		if bytes > 0 {
			n = max(1, a.out(l)*a.in(l)*4/bytes)
		}
		n = min(n, a.out(l))
		per := (a.out(l) + n - 1) / n
		a.split[l] = (a.out(l) + per - 1) / per // no empty chunk
	}
	return a
}

// sizes returns the parameters' sizes in forward order.
func (a arch) sizes() []int {
	var s []int
	for l := range a.layers() {
		for k := a.chunks(l) - 1; k >= 0; k-- {
			r0, r1 := a.chunkRows(l, k)
			s = append(s, (r1-r0)*a.in(l))
		}
		s = append(s, a.out(l))
	}
	return s
}

func (a arch) numParams() int {
	n := 0
	for _, s := range a.sizes() {
		n += s
	}
	return n
}

func (a arch) maxDim() int {
	m := 0
	for _, d := range a.dims {
		m = max(m, d)
	}
	return m
}

func (a arch) String() string {
	s := ""
	for i, d := range a.dims {
		if i > 0 {
			s += "→"
		}
		s += fmt.Sprint(d)
	}
	return s
}

// optimizer settings.
type optim struct {
	Kind     string  // "sgd", "momentum" or "adam"
	LR       float32 // learning rate
	Momentum float32
	Beta1    float32
	Beta2    float32
	Eps      float32
}

func (o optim) validate() error {
	switch o.Kind {
	case "sgd", "momentum", "adam":
		return nil
	}
	return fmt.Errorf("optimizer %q: want sgd, momentum or adam", o.Kind)
}

// initParams fills params (laid out as dp says) as PyTorch's Linear does:
// W and b uniform in ±1/sqrt(fan_in).
func initParams(a arch, params []float32, offset func(int) int, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 0x6d6c70))
	for l := range a.layers() {
		bound := float32(1 / math.Sqrt(float64(a.in(l))))
		for _, r := range []struct{ off, n int }{{offset(a.wIndex(l, 0)), a.out(l) * a.in(l)}, {offset(a.bIndex(l)), a.out(l)}} {
			for i := range r.n {
				params[r.off+i] = (2*rng.Float32() - 1) * bound
			}
		}
	}
}

// model is one rank's replica of the network on a CPU or a GPU. Step runs
// forward and backward on the loaded batch, lets DataParallel average the
// gradients while backward goes on, and applies the optimizer.
type model interface {
	// Load copies a batch of rows examples (x: rows × dims[0], labels) in.
	Load(x []float32, labels []int32) error
	Step(ctx context.Context) error
	// Loss returns the mean loss of the last Step (waits for it).
	Loss() (float32, error)
	// Predict returns the class of each of the rows examples of x.
	Predict(x []float32, rows int) ([]int32, error)
	// Params and Grads copy the parameters and the last gradients out, in
	// DataParallel's layout.
	Params() ([]float32, error)
	Grads() ([]float32, error)
	// Sync waits for the work enqueued so far.
	Sync() error
	// Transport says how the gradients travel: copy-engine or nccl on a
	// GPU, host on the CPU.
	Transport() string
	// SetLR sets the learning rate of the next Step.
	SetLR(lr float32)
	// State is what a snapshot holds: the parameters and the optimizer's
	// state, where they live (device memory on a GPU). Valid after Sync.
	State() []worker.Buffer
	Close() error
}

// modelConfig is what both models are built from.
type modelConfig struct {
	Arch       arch
	Batch      int // rows per Step
	Optim      optim
	ChunkBytes int  // split each weight into DataParallel parameters of about this many bytes (0: no split)
	FirstChunk int  // split the first layer's weight into parameters of about this many bytes (0: as ChunkBytes)
	BF16GEMM   bool // GPU: bfloat16 GEMM inputs, float32 accumulation and master weights
	DP         worker.DataParallelConfig
	Seed       uint64
	PTXPath    string // GPU: load kernels from this file instead of the embedded PTX
	Device     int    // GPU: CUDA device ordinal
	NoBcast    bool   // skip the broadcast of rank 0's initial parameters

	// GPU diagnostics (--trace, --no-reduce, --blas-sm-target).
	Trace        traceConfig
	NoReduce     bool // never all-reduce: each rank updates with its own gradients, on the compute stream
	BlasSMTarget int  // cublasSetSmCountTarget while backward's GEMMs are enqueued (0: cuBLAS's choice)
	Symmetric    bool // GPU: gradients in an NCCL symmetric window (ncclcomm.Comm.AllocSymmetric)
}

// traceConfig asks the GPU model for a CUDA event timeline of some steps.
type traceConfig struct {
	Steps int // Step calls traced (0: none)
	Skip  int // Step calls before the first traced one
	First int // the number printed for the first traced step
}
