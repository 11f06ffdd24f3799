//go:build cuda

package main

import (
	"context"
	"errors"
	"fmt"
	"math"
	"runtime"

	"github.com/gotrain/gotrain/gpu/cublas"
	"github.com/gotrain/gotrain/gpu/cudadrv"
	"github.com/gotrain/gotrain/worker"
	"github.com/gotrain/gotrain/worker/comm"
	"github.com/gotrain/gotrain/worker/ncclcomm"
)

// gpuModel is the network on one GPU: cuBLAS GEMMs and the example's
// kernels on a compute stream, in the device's primary context, driven from
// one locked OS thread (the goroutine that called newGPUModel). Gradients are
// averaged by worker.DataParallel on the NCCL communicator's stream; the
// optimizer runs there per bucket, as soon as the bucket is averaged.
type gpuModel struct {
	cfg    modelConfig
	a      arch
	dev    cudadrv.Device
	stream cudadrv.Stream
	blas   cublas.Handle
	k      *kernels
	dp     *worker.DataParallel
	allocs []cudadrv.DevicePtr

	params, grads  cudadrv.DevicePtr
	p16            cudadrv.DevicePtr // bfloat16 copy of params (BF16GEMM)
	state1, state2 cudadrv.DevicePtr
	t              int

	rows       int
	acts       []cudadrv.DevicePtr // acts[l]: Batch × dims[l]
	acts16     []cudadrv.DevicePtr
	dA, dB     cudadrv.DevicePtr // Batch × maxDim
	dA16, dB16 cudadrv.DevicePtr
	labels     cudadrv.DevicePtr // int32 × Batch
	lossRows   cudadrv.DevicePtr // float32 × Batch
	lastRows   int
	retained   bool

	freeSymmetric func() error // frees the gradients' symmetric window (--nccl-symmetric)

	nParams int
	tr      *stepTracer // --trace; nil when off
}

// newGPUModel locks the calling goroutine to its OS thread (it stays
// locked: every later call must come from the same goroutine), makes the
// device's primary context current and builds the model there.
func newGPUModel(ctx context.Context, c worker.Comm, cfg modelConfig) (model, error) {
	m, err := newGPU(ctx, c, cfg)
	if err != nil {
		return nil, err
	}
	return m, nil
}

func newGPU(ctx context.Context, c worker.Comm, cfg modelConfig) (_ *gpuModel, err error) {
	runtime.LockOSThread()
	drv, err := cudadrv.Load()
	if err != nil {
		return nil, err
	}
	m := &gpuModel{cfg: cfg, a: cfg.Arch.withChunks(cfg.ChunkBytes, cfg.FirstChunk)}
	defer func() {
		if err != nil {
			m.Close()
		}
	}()
	if err = m.openDevice(drv); err != nil {
		return nil, err
	}
	if err = m.allocate(c); err != nil {
		return nil, err
	}
	if err = m.startDataParallel(ctx, c); err != nil {
		return nil, err
	}
	m.rows = cfg.Batch
	return m, m.stream.Synchronize()
}

// openDevice makes the device's primary context current and sets up the
// compute stream, cuBLAS on it and the example's kernels.
func (m *gpuModel) openDevice(drv *cudadrv.Driver) (err error) {
	cfg := m.cfg
	if m.dev, err = drv.Device(cfg.Device); err != nil {
		return err
	}
	pctx, err := m.dev.RetainPrimaryContext()
	if err != nil {
		return err
	}
	m.retained = true
	if err = pctx.SetCurrent(); err != nil {
		return err
	}
	if m.stream, err = cudadrv.NewStream(cudadrv.StreamNonBlocking); err != nil {
		return err
	}
	if _, err = cublas.Load(); err != nil {
		return err
	}
	if m.blas, err = cublas.New(); err != nil {
		return err
	}
	if err = m.blas.SetStream(uintptr(m.stream)); err != nil {
		return err
	}
	if cfg.BlasSMTarget > 0 { // fail here, not in the first step, on a cuBLAS without it
		if err = m.blas.SetSmCountTarget(cfg.BlasSMTarget); err != nil {
			return err
		}
		if err = m.blas.SetSmCountTarget(0); err != nil {
			return err
		}
	}
	m.k, err = loadKernels(cfg.PTXPath)
	return err
}

// allocate allocates the parameters, gradients, optimizer state and
// activations, and zeroes the gradients and the state.
func (m *gpuModel) allocate(c worker.Comm) (err error) {
	cfg, a := m.cfg, m.a
	n := a.numParams()
	m.nParams = n
	m.params = m.alloc(4 * n)
	if cfg.Symmetric {
		if m.grads, err = m.allocSymmetric(c, 4*n); err != nil {
			return err
		}
	} else {
		m.grads = m.alloc(4 * n)
	}
	if cfg.BF16GEMM {
		m.p16 = m.alloc(2 * n)
	}
	switch cfg.Optim.Kind {
	case "momentum":
		m.state1 = m.alloc(4 * n)
	case "adam":
		m.state1, m.state2 = m.alloc(4*n), m.alloc(4*n)
	}
	m.allocActivations()
	for _, p := range m.allocs {
		if p == 0 {
			return errors.New("allocate device memory: out of memory?")
		}
	}
	for _, s := range []cudadrv.DevicePtr{m.state1, m.state2, m.grads} {
		if s != 0 {
			if err = cudadrv.MemsetD32(s, 0, n); err != nil {
				return err
			}
		}
	}
	return nil
}

// allocActivations allocates a batch's activations, the ping-pong
// gradients of backward, the labels and the per-row losses.
func (m *gpuModel) allocActivations() {
	B, a, bf16 := m.cfg.Batch, m.a, m.cfg.BF16GEMM
	for _, d := range a.dims {
		m.acts = append(m.acts, m.alloc(4*B*d))
		if bf16 {
			m.acts16 = append(m.acts16, m.alloc(2*B*d))
		} else {
			m.acts16 = append(m.acts16, 0)
		}
	}
	m.dA, m.dB = m.alloc(4*B*a.maxDim()), m.alloc(4*B*a.maxDim())
	if bf16 {
		m.dA16, m.dB16 = m.alloc(2*B*a.maxDim()), m.alloc(2*B*a.maxDim())
	}
	m.labels, m.lossRows = m.alloc(4*B), m.alloc(4*B)
}

// startDataParallel sets up DataParallel over the gradients (and the
// tracer, with --trace), initialises the parameters and gives every rank
// rank 0's.
func (m *gpuModel) startDataParallel(ctx context.Context, c worker.Comm) (err error) {
	cfg, a, n := m.cfg, m.a, m.nParams
	dpc := cfg.DP
	dpc.Stream = uintptr(m.stream)
	dpc.Kernels = m.k
	dpc.AfterReduce = m.afterReduce
	if m.dp, err = worker.NewDataParallel(ctx, c, a.sizes(), comm.Device(uintptr(m.grads), n, comm.Float32), dpc); err != nil {
		return err
	}
	if cfg.Trace.Steps > 0 {
		if m.tr, err = newStepTracer(cfg.Trace, a, m.dp.Buckets(), m.stream); err != nil {
			return err
		}
	}
	host := make([]float32, n)
	initParams(a, host, m.dp.Offset, cfg.Seed)
	if err = cudadrv.CopyToDevice(m.params, host); err != nil {
		return err
	}
	if !cfg.NoBcast {
		if err = m.dp.BroadcastParams(ctx, comm.Device(uintptr(m.params), n, comm.Float32)); err != nil {
			return err
		}
	}
	if cfg.BF16GEMM {
		return m.k.ToBF16(uintptr(m.p16), uintptr(m.params), n, uintptr(m.stream))
	}
	return nil
}

// alloc allocates bytes of device memory, recording 0 on failure (checked
// by the caller once).
// allocSymmetric allocates the gradients in an NCCL symmetric window of c's
// NCCL communicator (every rank at once: registration is collective).
func (m *gpuModel) allocSymmetric(c worker.Comm, bytes int) (cudadrv.DevicePtr, error) {
	for {
		u, ok := c.(interface{ Unwrap() worker.Comm })
		if !ok {
			break
		}
		c = u.Unwrap()
	}
	nc, ok := c.(*ncclcomm.Comm)
	if !ok {
		return 0, fmt.Errorf("--nccl-symmetric needs the NCCL backend (the communicator is %T)", c)
	}
	p, free, err := nc.AllocSymmetric(bytes)
	if err != nil {
		return 0, err
	}
	m.freeSymmetric = free
	return cudadrv.DevicePtr(p), nil
}

func (m *gpuModel) alloc(bytes int) cudadrv.DevicePtr {
	p, err := cudadrv.MemAlloc(bytes)
	if err != nil {
		p = 0
	}
	m.allocs = append(m.allocs, p)
	return p
}

// wAt and bAt return the addresses of W_l and b_l in a buffer of
// elemSize-byte elements (0 in a nil buffer).
func (m *gpuModel) wAt(buf cudadrv.DevicePtr, l, elemSize int) cudadrv.DevicePtr {
	if buf == 0 {
		return 0
	}
	return buf + cudadrv.DevicePtr(elemSize*m.dp.Offset(m.a.wIndex(l, 0)))
}

func (m *gpuModel) bAt(buf cudadrv.DevicePtr, l, elemSize int) cudadrv.DevicePtr {
	if buf == 0 {
		return 0
	}
	return buf + cudadrv.DevicePtr(elemSize*m.dp.Offset(m.a.bIndex(l)))
}

func (m *gpuModel) Load(x []float32, labels []int32) error {
	rows := len(labels)
	if rows > m.cfg.Batch || len(x) != rows*m.a.dims[0] {
		return fmt.Errorf("batch of %d rows (%d values), want at most %d rows of %d", rows, len(x), m.cfg.Batch, m.a.dims[0])
	}
	m.rows = rows
	// On the compute stream: the previous step may still read the batch.
	if err := cudadrv.CopyToDeviceAsync(m.acts[0], x, m.stream); err != nil {
		return err
	}
	if err := cudadrv.CopyToDeviceAsync(m.labels, labels, m.stream); err != nil {
		return err
	}
	if m.cfg.BF16GEMM {
		return m.k.ToBF16(uintptr(m.acts16[0]), uintptr(m.acts[0]), len(x), uintptr(m.stream))
	}
	return nil
}

// gemm is C = op(A)·op(B) + beta·C in column-major terms, in float32, or
// with the bfloat16 copies a16, b16 of A and B.
func (m *gpuModel) gemm(ta, tb cublas.Op, M, N, K int, a, a16 cudadrv.DevicePtr, lda int, b, b16 cudadrv.DevicePtr, ldb int, beta float32, c cudadrv.DevicePtr, ldc int) error {
	if m.cfg.BF16GEMM {
		return m.blas.GemmEx(ta, tb, M, N, K, 1, uintptr(a16), cublas.R16BF, lda, uintptr(b16), cublas.R16BF, ldb, beta, uintptr(c), cublas.R32F, ldc, cublas.Compute32F)
	}
	return m.blas.Sgemm(ta, tb, M, N, K, 1, uintptr(a), lda, uintptr(b), ldb, beta, uintptr(c), ldc)
}

// forward leaves the logits in acts[L]. Row-major Y (rows×out) = X·Wᵀ + b is
// column-major Yᶜ (out×rows) = Wᶜᵀ·Xᶜ.
func (m *gpuModel) forward(rows int) error {
	for l := range m.a.layers() {
		in, out := m.a.in(l), m.a.out(l)
		w, w16 := m.wAt(m.params, l, 4), m.wAt(m.p16, l, 2)
		if err := m.gemm(cublas.T, cublas.N, out, rows, in, w, w16, in, m.acts[l], m.acts16[l], in, 0, m.acts[l+1], out); err != nil {
			return err
		}
		relu := 0
		if l < m.a.layers()-1 {
			relu = 1
		}
		g, b := grid1D(rows * out)
		if err := m.k.biasAct.Launch(g, b, 0, m.stream, m.acts[l+1], m.bAt(m.params, l, 4), rows, out, relu, m.acts16[l+1]); err != nil {
			return err
		}
	}
	return nil
}

func (m *gpuModel) Step(ctx context.Context) error {
	rows := m.rows
	m.tr.mark(tpStart, 0, 0)
	if err := m.forward(rows); err != nil {
		return err
	}
	m.tr.mark(tpForward, 0, 0)
	if err := m.lossGrad(rows); err != nil {
		return err
	}
	var beta float32
	if m.dp.MicroStep() > 0 {
		beta = 1
	}
	// With DeferUpdate the weight gradient comes first, so that its
	// reduction starts one GEMM earlier and overlaps the input gradient,
	// which reads W_l; Release then lets the optimizer (on the
	// communication stream) overwrite W_l. Without it the input gradient
	// comes first: W_l is not read after Ready, since the optimizer updates
	// it right after the reduction.
	weightFirst := m.dp.Syncing() && m.cfg.DP.DeferUpdate
	g := pingPong{m.dA, m.dB, m.dA16, m.dB16}
	if err := m.smTarget(m.cfg.BlasSMTarget); err != nil {
		return err
	}
	for l := m.a.layers() - 1; l >= 0; l-- {
		if err := m.backwardLayer(ctx, l, rows, beta, weightFirst, g); err != nil {
			return err
		}
		g = g.swapped()
	}
	if err := m.smTarget(0); err != nil {
		return err
	}
	m.tr.mark(tpBackward, 0, 0)
	return m.finishStep(ctx)
}

// pingPong are backward's gradient buffers: cur holds the gradient of the
// layer's output, next receives its input's (and their bfloat16 copies).
type pingPong struct{ cur, next, cur16, next16 cudadrv.DevicePtr }

func (g pingPong) swapped() pingPong { return pingPong{g.next, g.cur, g.next16, g.cur16} }

// lossGrad enqueues the softmax cross-entropy of the last layer's output:
// the per-row losses and the gradient of the logits, into dA.
func (m *gpuModel) lossGrad(rows int) error {
	classes := m.a.dims[m.a.layers()]
	threads := uint32(32)
	for threads < 1024 && int(threads) < classes {
		threads *= 2
	}
	threads = min(threads, 256)
	if err := m.k.softmaxXent.Launch(cudadrv.Dim3{X: uint32(rows)}, cudadrv.Dim3{X: threads}, 0, m.stream,
		m.acts[m.a.layers()], m.labels, m.dA, m.lossRows, rows, classes, 1/float32(rows)); err != nil {
		return err
	}
	m.tr.mark(tpSoftmax, 0, 0)
	m.lastRows = rows
	if m.cfg.BF16GEMM {
		return m.k.ToBF16(uintptr(m.dA16), uintptr(m.dA), rows*classes, uintptr(m.stream))
	}
	return nil
}

// backwardLayer enqueues layer l's backward: the bias gradient, the weight
// gradient (chunk by chunk) and the input gradient (first or last, see
// weightFirst), handing each gradient to DataParallel as it is enqueued.
func (m *gpuModel) backwardLayer(ctx context.Context, l, rows int, beta float32, weightFirst bool, g pingPong) error {
	a := m.a
	out := a.out(l)
	if err := m.k.biasGrad.Launch(cudadrv.Dim3{X: uint32((out + 31) / 32)}, cudadrv.Dim3{X: 32, Y: 8}, 0, m.stream,
		m.bAt(m.grads, l, 4), g.cur, rows, out, beta); err != nil {
		return err
	}
	m.tr.mark(tpBiasGrad, l, 0)
	if err := m.ready(ctx, a.bIndex(l)); err != nil {
		return err
	}
	if err := m.release(ctx, a.bIndex(l)); err != nil { // backward never reads b_l
		return err
	}
	if !weightFirst {
		if err := m.inputGrad(l, rows, g); err != nil {
			return err
		}
	}
	if err := m.weightGrad(ctx, l, rows, beta, g); err != nil {
		return err
	}
	if weightFirst {
		if err := m.inputGrad(l, rows, g); err != nil {
			return err
		}
	}
	for k := range a.chunks(l) {
		if err := m.release(ctx, a.wIndex(l, k)); err != nil {
			return err
		}
	}
	return nil
}

// inputGrad enqueues the gradient of layer l's input into g.next (none for
// the first layer).
func (m *gpuModel) inputGrad(l, rows int, g pingPong) error {
	if l == 0 {
		return nil
	}
	in, out := m.a.in(l), m.a.out(l)
	w, w16 := m.wAt(m.params, l, 4), m.wAt(m.p16, l, 2)
	// dX (rows×in) = G·W: column-major dXᶜ (in×rows) = Wᶜ·Gᶜ.
	if err := m.gemm(cublas.N, cublas.N, in, rows, out, w, w16, in, g.cur, g.cur16, out, 0, g.next, in); err != nil {
		return err
	}
	gr, b := grid1D(rows * in)
	if err := m.k.reluBwd.Launch(gr, b, 0, m.stream, g.next, m.acts[l], int64(rows*in), uintptr(g.next16)); err != nil {
		return err
	}
	m.tr.mark(tpDX, l, 0)
	return nil
}

// weightGrad enqueues layer l's weight gradient: dW (out×in) = Gᵀ·X,
// column-major dWᶜ (in×out) = Xᶜ·Gᶜᵀ, one chunk of rows r0..r1 (columns of
// dWᶜ, rows of Gᶜ) at a time, each handed to DataParallel as soon as it is
// enqueued.
func (m *gpuModel) weightGrad(ctx context.Context, l, rows int, beta float32, g pingPong) error {
	a := m.a
	in, out := a.in(l), a.out(l)
	dw := m.wAt(m.grads, l, 4)
	for k := range a.chunks(l) {
		r0, r1 := a.chunkRows(l, k)
		gk, gk16 := g.cur+cudadrv.DevicePtr(4*r0), cudadrv.DevicePtr(0)
		if g.cur16 != 0 {
			gk16 = g.cur16 + cudadrv.DevicePtr(2*r0)
		}
		if err := m.gemm(cublas.N, cublas.T, in, r1-r0, rows, m.acts[l], m.acts16[l], in, gk, gk16, out, beta, dw+cudadrv.DevicePtr(4*r0*in), in); err != nil {
			return err
		}
		m.tr.mark(tpDW, l, k)
		if err := m.ready(ctx, a.wIndex(l, k)); err != nil {
			return err
		}
	}
	return nil
}

// finishStep ends the step: DataParallel's Finish (the compute stream then
// waits for every reduction and update), or with NoReduce this rank's own
// update on the compute stream.
func (m *gpuModel) finishStep(ctx context.Context) error {
	if m.cfg.NoReduce { // this rank's own gradients, updated on the compute stream
		if err := m.update(worker.Bucket{Len: m.nParams}, uintptr(m.stream)); err != nil {
			return err
		}
		m.t++
		m.tr.mark(tpFinish, 0, 0)
		return nil
	}
	synced, err := m.dp.Finish(ctx)
	if err != nil {
		return err
	}
	m.tr.mark(tpFinish, 0, 0) // the compute stream now waits for every reduction and update
	if synced {
		m.t++
	}
	return nil
}

// ready and release hand parameter i to DataParallel, except with NoReduce.
func (m *gpuModel) ready(ctx context.Context, i int) error {
	if m.cfg.NoReduce {
		return nil
	}
	return m.dp.Ready(ctx, i)
}

func (m *gpuModel) release(ctx context.Context, i int) error {
	if m.cfg.NoReduce {
		return nil
	}
	return m.dp.Release(ctx, i)
}

// smTarget sets cuBLAS's SM count target to n when --blas-sm-target is set.
func (m *gpuModel) smTarget(n int) error {
	if m.cfg.BlasSMTarget == 0 {
		return nil
	}
	return m.blas.SetSmCountTarget(n)
}

// afterReduce enqueues the optimizer step of one bucket on the
// communication stream, right after its all-reduce.
func (m *gpuModel) afterReduce(b worker.Bucket, s uintptr) error {
	m.tr.markBucket(b, s, false)
	if err := m.update(b, s); err != nil {
		return err
	}
	m.tr.markBucket(b, s, true)
	return nil
}

// update enqueues the optimizer step of the parameters of b on stream s.
func (m *gpuModel) update(b worker.Bucket, s uintptr) error {
	off := uintptr(b.Offset)
	p, g := uintptr(m.params)+4*off, uintptr(m.grads)+4*off
	var p16 uintptr
	if m.p16 != 0 {
		p16 = uintptr(m.p16) + 2*off
	}
	n := int64(b.Len)
	o := m.cfg.Optim
	gp, gs := b.Peer, b.Scale // the peer's gradients to add (FusedSum), or 0
	switch o.Kind {
	case "sgd":
		return m.k.elementwise(m.k.sgd, b.Len, s, p, g, gp, gs, o.LR, n, p16)
	case "momentum":
		return m.k.elementwise(m.k.sgdMomentum, b.Len, s, p, g, gp, gs, uintptr(m.state1)+4*off, o.LR, o.Momentum, n, p16)
	case "adam":
		t := float64(m.t + 1)
		c1 := float32(1 - math.Pow(float64(o.Beta1), t))
		c2 := float32(1 - math.Pow(float64(o.Beta2), t))
		return m.k.elementwise(m.k.adam, b.Len, s, p, g, gp, gs, uintptr(m.state1)+4*off, uintptr(m.state2)+4*off,
			o.LR, o.Beta1, o.Beta2, o.Eps, c1, c2, n, p16)
	}
	return errors.New("unknown optimizer " + o.Kind)
}

func (m *gpuModel) Loss() (float32, error) {
	if err := m.stream.Synchronize(); err != nil {
		return 0, err
	}
	l := make([]float32, m.lastRows)
	if err := cudadrv.CopyFromDevice(l, m.lossRows); err != nil {
		return 0, err
	}
	var sum float64
	for _, v := range l {
		sum += float64(v)
	}
	return float32(sum / float64(len(l))), nil
}

func (m *gpuModel) Predict(x []float32, rows int) ([]int32, error) {
	in := m.a.dims[0]
	L := m.a.layers()
	classes := m.a.dims[L]
	out := make([]int32, 0, rows)
	logits := make([]float32, m.cfg.Batch*classes)
	for lo := 0; lo < rows; lo += m.cfg.Batch {
		n := min(m.cfg.Batch, rows-lo)
		if err := cudadrv.CopyToDeviceAsync(m.acts[0], x[lo*in:(lo+n)*in], m.stream); err != nil {
			return nil, err
		}
		if m.cfg.BF16GEMM {
			if err := m.k.ToBF16(uintptr(m.acts16[0]), uintptr(m.acts[0]), n*in, uintptr(m.stream)); err != nil {
				return nil, err
			}
		}
		if err := m.forward(n); err != nil {
			return nil, err
		}
		if err := m.stream.Synchronize(); err != nil {
			return nil, err
		}
		if err := cudadrv.CopyFromDevice(logits[:n*classes], m.acts[L]); err != nil {
			return nil, err
		}
		for r := range n {
			row := logits[r*classes : (r+1)*classes]
			best := 0
			for c, v := range row {
				if v > row[best] {
					best = c
				}
			}
			out = append(out, int32(best))
		}
	}
	return out, nil
}

func (m *gpuModel) copyOut(p cudadrv.DevicePtr) ([]float32, error) {
	if err := m.stream.Synchronize(); err != nil {
		return nil, err
	}
	h := make([]float32, m.a.numParams())
	return h, cudadrv.CopyFromDevice(h, p)
}

func (m *gpuModel) Params() ([]float32, error) { return m.copyOut(m.params) }
func (m *gpuModel) Grads() ([]float32, error)  { return m.copyOut(m.grads) }
func (m *gpuModel) Transport() string          { return m.dp.Transport().String() }
func (m *gpuModel) Sync() error                { return m.stream.Synchronize() }
func (m *gpuModel) SetLR(lr float32)           { m.cfg.Optim.LR = lr }

// State is the parameters and the optimizer's state, in device memory.
func (m *gpuModel) State() []worker.Buffer {
	st := []worker.Buffer{comm.Device(uintptr(m.params), m.nParams, comm.Float32)}
	for _, p := range []cudadrv.DevicePtr{m.state1, m.state2} {
		if p != 0 {
			st = append(st, comm.Device(uintptr(p), m.nParams, comm.Float32))
		}
	}
	return st
}

func (m *gpuModel) Close() error {
	if m.stream != 0 {
		m.stream.Synchronize()
	}
	if m.dp != nil {
		m.dp.Close()
	}
	if m.freeSymmetric != nil {
		m.freeSymmetric()
	}
	m.tr.close()
	for _, p := range m.allocs {
		if p != 0 {
			p.Free()
		}
	}
	m.allocs = nil
	if m.blas != 0 {
		m.blas.Destroy()
	}
	if m.k != nil {
		m.k.mod.Unload()
	}
	if m.stream != 0 {
		m.stream.Destroy()
	}
	if m.retained {
		m.dev.ReleasePrimaryContext()
	}
	return nil
}
