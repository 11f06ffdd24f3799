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
// as PyTorch's Linear) and bias b_l; parameter 2l is W_l, 2l+1 is b_l.
type arch struct{ dims []int }

func (a arch) layers() int   { return len(a.dims) - 1 }
func (a arch) in(l int) int  { return a.dims[l] }
func (a arch) out(l int) int { return a.dims[l+1] }

// sizes returns the parameters' sizes in forward order.
func (a arch) sizes() []int {
	var s []int
	for l := range a.layers() {
		s = append(s, a.out(l)*a.in(l), a.out(l))
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
	p := 0
	for l := range a.layers() {
		bound := float32(1 / math.Sqrt(float64(a.in(l))))
		for _, n := range []int{a.out(l) * a.in(l), a.out(l)} {
			off := offset(p)
			for i := range n {
				params[off+i] = (2*rng.Float32() - 1) * bound
			}
			p++
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
	// SetLR sets the learning rate of the next Step.
	SetLR(lr float32)
	Close() error
}

// modelConfig is what both models are built from.
type modelConfig struct {
	Arch     arch
	Batch    int // rows per Step
	Optim    optim
	BF16GEMM bool // GPU: bfloat16 GEMM inputs, float32 accumulation and master weights
	DP       worker.DataParallelConfig
	Seed     uint64
	PTXPath  string // GPU: load kernels from this file instead of the embedded PTX
	Device   int    // GPU: CUDA device ordinal
	NoBcast  bool   // skip the broadcast of rank 0's initial parameters
}
