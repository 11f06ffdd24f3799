//go:build cuda

package main

import (
	_ "embed"
	"fmt"
	"os"

	"github.com/gotrain/gotrain/gpu/cudadrv"
)

// mlpPTX is kernels/mlp.cu compiled by `make ptx` (nvcc -ptx -arch=sm_90).
//
//go:embed kernels/mlp.ptx
var mlpPTX string

// kernels are the example's CUDA kernels, loaded into the current context.
type kernels struct {
	mod                                              cudadrv.Module
	biasAct, reluBwd, softmaxXent, biasGrad          cudadrv.Function
	sgd, sgdMomentum, adam, toBF16, fromBF16, scaleF cudadrv.Function
}

// loadKernels loads the embedded PTX, or the PTX in file path when it is
// not empty.
func loadKernels(path string) (*kernels, error) {
	image := mlpPTX
	if path != "" {
		b, err := os.ReadFile(path)
		if err != nil {
			return nil, err
		}
		image = string(b)
	}
	mod, err := cudadrv.LoadModule(image)
	if err != nil {
		return nil, fmt.Errorf("load the MLP kernels (run `make ptx` if kernels/mlp.ptx is a placeholder): %w", err)
	}
	k := &kernels{mod: mod}
	for _, f := range []struct {
		fn   *cudadrv.Function
		name string
	}{
		{&k.biasAct, "bias_act"}, {&k.reluBwd, "relu_bwd"}, {&k.softmaxXent, "softmax_xent"},
		{&k.biasGrad, "bias_grad"}, {&k.sgd, "sgd"}, {&k.sgdMomentum, "sgd_momentum"}, {&k.adam, "adam"},
		{&k.toBF16, "f32_to_bf16"}, {&k.fromBF16, "bf16_to_f32"}, {&k.scaleF, "scale_f32"},
	} {
		if *f.fn, err = mod.Function(f.name); err != nil {
			mod.Unload()
			return nil, fmt.Errorf("kernel %s: %w", f.name, err)
		}
	}
	return k, nil
}

// grid1D is the grid of an element-wise kernel over n elements, 256 threads
// a block; the kernels loop, so the grid is capped.
func grid1D(n int) (cudadrv.Dim3, cudadrv.Dim3) {
	return cudadrv.Dim3{X: uint32(min(max((n+255)/256, 1), 8192))}, cudadrv.Dim3{X: 256}
}

func (k *kernels) elementwise(f cudadrv.Function, n int, s uintptr, args ...any) error {
	g, b := grid1D(n)
	return f.Launch(g, b, 0, cudadrv.Stream(s), args...)
}

// The DeviceKernels of worker.DataParallel.

func (k *kernels) ToBF16(dst, src uintptr, n int, s uintptr) error {
	return k.elementwise(k.toBF16, n, s, dst, src, int64(n))
}

func (k *kernels) FromBF16(dst, src uintptr, n int, scale float32, s uintptr) error {
	return k.elementwise(k.fromBF16, n, s, dst, src, int64(n), scale)
}

func (k *kernels) Scale(p uintptr, n int, f float32, s uintptr) error {
	return k.elementwise(k.scaleF, n, s, p, int64(n), f)
}
