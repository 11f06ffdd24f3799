package doctor

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"runtime"
	"sync"
	"time"

	"github.com/gotrain/gotrain/gpu/cudadrv"
	"github.com/gotrain/gotrain/internal/gpu/gpuinfo"
	"github.com/gotrain/gotrain/nccl"
)

// Sizes of the smoke test.
const (
	smokeElems     = 1<<20 + 7 // AXPY elements per GPU (an odd count tests the bounds check)
	allReduceBytes = 256 << 20 // all-reduce message
	allReduceIters = 10
	smokeTimeout   = 2 * time.Minute
)

// gpuThread is one GPU's locked OS thread with the device's primary
// context current.
type gpuThread struct {
	index  int // NVML index
	dev    cudadrv.Device
	stream cudadrv.Stream
	work   chan func()
}

func (g *gpuThread) do(f func() error) error {
	done := make(chan error, 1)
	g.work <- func() { done <- f() }
	return <-done
}

func onAll(gs []*gpuThread, f func(g *gpuThread) error) error {
	errs := make([]error, len(gs))
	var wg sync.WaitGroup
	for i, g := range gs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := g.do(func() error { return f(g) }); err != nil {
				errs[i] = fmt.Errorf("GPU%d: %w", g.index, err)
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// Smoke is the real smoke test: on each GPU (found in CUDA by its PCI bus
// id) it allocates memory, runs a hand-written AXPY kernel and checks every
// element; then, with withNCCL, it all-reduces 256 MiB of float32 across all
// the GPUs from this one process (one communicator per GPU, each on its own
// locked thread) and checks the sums. It gives up after two minutes.
func Smoke(ctx context.Context, gpus []gpuinfo.Device, withNCCL bool) (*SmokeResult, error) {
	ctx, cancel := context.WithTimeout(ctx, smokeTimeout)
	defer cancel()
	type answer struct {
		res *SmokeResult
		err error
	}
	done := make(chan answer, 1)
	go func() {
		res, err := smoke(gpus, withNCCL)
		done <- answer{res, err}
	}()
	select {
	case a := <-done:
		return a.res, a.err
	case <-ctx.Done():
		// A hung driver or NCCL call cannot be interrupted; the threads stay
		// blocked until the process exits.
		return nil, fmt.Errorf("the smoke test did not finish within %s: %w", smokeTimeout, ctx.Err())
	}
}

func smoke(gpus []gpuinfo.Device, withNCCL bool) (*SmokeResult, error) {
	drv, err := cudadrv.Load()
	if err != nil {
		return nil, err
	}
	n, err := drv.DeviceCount()
	if err != nil {
		return nil, err
	}
	byBus := map[string]cudadrv.Device{}
	for i := range n {
		d, err := drv.Device(i)
		if err != nil {
			return nil, err
		}
		bus, err := d.PCIBusID()
		if err != nil {
			return nil, err
		}
		byBus[gpuinfo.BusIDKey(bus)] = d
	}
	res := &SmokeResult{}
	var threads []*gpuThread
	defer func() {
		for _, g := range threads {
			close(g.work)
		}
	}()
	for _, info := range gpus {
		dev, ok := byBus[gpuinfo.BusIDKey(info.PCIBusID)]
		if !ok {
			res.GPUs = append(res.GPUs, SmokeGPU{Index: info.Index, Error: fmt.Sprintf("CUDA does not see the GPU at %s (CUDA_VISIBLE_DEVICES=%q hides it?)", info.PCIBusID, envOr("CUDA_VISIBLE_DEVICES"))})
			continue
		}
		g := &gpuThread{index: info.Index, dev: dev, work: make(chan func())}
		ready := make(chan error)
		go g.loop(ready)
		if err := <-ready; err != nil {
			res.GPUs = append(res.GPUs, SmokeGPU{Index: info.Index, Error: err.Error()})
			continue
		}
		threads = append(threads, g)
	}
	res.Peers = peerAccess(threads)
	kernelOK := make([]error, len(threads))
	var wg sync.WaitGroup
	for i, g := range threads {
		wg.Add(1)
		go func() { defer wg.Done(); kernelOK[i] = g.do(g.axpy) }()
	}
	wg.Wait()
	allOK := len(threads) == len(gpus)
	for i, g := range threads {
		sg := SmokeGPU{Index: g.index, OK: kernelOK[i] == nil}
		if kernelOK[i] != nil {
			sg.Error = kernelOK[i].Error()
			allOK = false
		}
		res.GPUs = append(res.GPUs, sg)
	}
	if withNCCL {
		if !allOK {
			res.AllReduce = &AllReduceResult{GPUs: len(gpus), Bytes: allReduceBytes, Error: "skipped: a GPU failed the kernel test"}
		} else {
			res.AllReduce = allReduce(threads)
		}
	}
	return res, nil
}

func envOr(k string) string { return os.Getenv(k) }

// peerAccess asks CUDA, for every pair of GPUs, whether each can map the
// other's memory.
func peerAccess(threads []*gpuThread) []PeerAccess {
	var out []PeerAccess
	for i, a := range threads {
		for _, b := range threads[i+1:] {
			p := PeerAccess{A: a.index, B: b.index}
			ab, err := a.dev.CanAccessPeer(b.dev)
			if err == nil {
				var ba bool
				ba, err = b.dev.CanAccessPeer(a.dev)
				p.OK = ab && ba
			}
			if err != nil {
				p.Error = err.Error()
			}
			out = append(out, p)
		}
	}
	return out
}

// loop runs g's work on one locked OS thread with the primary context current.
func (g *gpuThread) loop(ready chan<- error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	ctx, err := g.dev.RetainPrimaryContext()
	if err != nil {
		ready <- err
		return
	}
	defer g.dev.ReleasePrimaryContext()
	if err := ctx.SetCurrent(); err != nil {
		ready <- err
		return
	}
	if g.stream, err = cudadrv.NewStream(cudadrv.StreamNonBlocking); err != nil {
		ready <- err
		return
	}
	defer g.stream.Destroy()
	ready <- nil
	for f := range g.work {
		f()
	}
}

// axpy computes y = 3x + y on the GPU and checks every element.
func (g *gpuThread) axpy() error {
	major, minor, err := g.dev.ComputeCapability()
	if err != nil {
		return err
	}
	mod, err := cudadrv.LoadModule(cudadrv.AXPYPTX(major, minor))
	if err != nil {
		return fmt.Errorf("load the test kernel: %w", err)
	}
	defer mod.Unload()
	fn, err := mod.Function(cudadrv.AXPYName)
	if err != nil {
		return err
	}
	x, y := make([]float32, smokeElems), make([]float32, smokeElems)
	for i := range x {
		x[i], y[i] = float32(i%4096), float32(g.index+1)
	}
	dx, err := cudadrv.MemAlloc(4 * smokeElems)
	if err != nil {
		return err
	}
	defer dx.Free()
	dy, err := cudadrv.MemAlloc(4 * smokeElems)
	if err != nil {
		return err
	}
	defer dy.Free()
	if err := cudadrv.CopyToDevice(dx, x); err != nil {
		return err
	}
	if err := cudadrv.CopyToDevice(dy, y); err != nil {
		return err
	}
	if err := fn.Launch(cudadrv.Dim3{X: (smokeElems + 255) / 256}, cudadrv.Dim3{X: 256}, 0, g.stream, dy, dx, float32(3), uint32(smokeElems)); err != nil {
		return err
	}
	if err := g.stream.Synchronize(); err != nil {
		return err
	}
	if err := cudadrv.CopyFromDevice(y, dy); err != nil {
		return err
	}
	for i, v := range y {
		if want := 3*float32(i%4096) + float32(g.index+1); v != want {
			return fmt.Errorf("the test kernel computed y[%d] = %v, want %v", i, v, want)
		}
	}
	return nil
}

// allReduce sums allReduceBytes of float32 across the threads' GPUs, times
// allReduceIters rounds with CUDA events, and checks the result.
func allReduce(threads []*gpuThread) *AllReduceResult {
	n := len(threads)
	res := &AllReduceResult{GPUs: n, Bytes: allReduceBytes}
	lib, err := nccl.Load()
	if err != nil {
		res.Error = err.Error()
		return res
	}
	id, err := lib.GetUniqueID()
	if err != nil {
		res.Error = err.Error()
		return res
	}
	a := &smokeAllReduce{threads: threads, count: allReduceBytes / 4,
		comms: make([]*nccl.Comm, n), bufs: make([][2]cudadrv.DevicePtr, n)}
	if err := onAll(threads, func(g *gpuThread) (err error) {
		a.comms[a.rank(g)], err = lib.InitRank(n, id, a.rank(g))
		return err
	}); err != nil {
		res.Error = "ncclCommInitRank: " + err.Error()
		return res
	}
	defer onAll(threads, func(g *gpuThread) error { return a.comms[a.rank(g)].Destroy() })
	err = onAll(threads, a.alloc)
	defer onAll(threads, a.free)
	if err != nil {
		res.Error = "allocate: " + err.Error()
		return res
	}
	// Warm up (connections are set up lazily), then time.
	if err := onAll(threads, a.warmUp); err != nil {
		res.Error = err.Error()
		return res
	}
	times := make([]time.Duration, n)
	if err := onAll(threads, func(g *gpuThread) (err error) {
		times[a.rank(g)], err = a.time(g)
		return err
	}); err != nil {
		res.Error = err.Error()
		return res
	}
	for _, t := range times {
		res.Time = max(res.Time, t/allReduceIters)
	}
	if res.Time > 0 {
		res.AlgBW = float64(allReduceBytes) / res.Time.Seconds() / 1e9
		res.BusBW = res.AlgBW * 2 * float64(n-1) / float64(n)
	}
	res.Correct = true
	if err := onAll(threads, a.check); err != nil {
		res.Correct = false
		res.Mismatch = err.Error()
	}
	return res
}

// smokeAllReduce is allReduce's communicators and buffers, one of each per
// GPU thread; its methods run on the thread (onAll).
type smokeAllReduce struct {
	threads []*gpuThread
	count   int // float32 per buffer
	comms   []*nccl.Comm
	bufs    [][2]cudadrv.DevicePtr // per rank: send, receive
}

// rank is g's rank: its index among the threads.
func (a *smokeAllReduce) rank(g *gpuThread) int {
	for i, t := range a.threads {
		if t == g {
			return i
		}
	}
	return -1
}

// alloc allocates g's buffers and fills the send buffer with rank+1.
func (a *smokeAllReduce) alloc(g *gpuThread) error {
	r := a.rank(g)
	var err error
	for k := range 2 {
		if a.bufs[r][k], err = cudadrv.MemAlloc(allReduceBytes); err != nil {
			return err
		}
	}
	return cudadrv.MemsetD32(a.bufs[r][0], math.Float32bits(float32(r+1)), a.count)
}

func (a *smokeAllReduce) free(g *gpuThread) error {
	for _, p := range a.bufs[a.rank(g)] {
		if p != 0 {
			p.Free()
		}
	}
	return nil
}

// run enqueues iters all-reduces on g's stream.
func (a *smokeAllReduce) run(g *gpuThread, iters int) error {
	b := a.bufs[a.rank(g)]
	for range iters {
		if err := a.comms[a.rank(g)].AllReduce(uintptr(b[0]), uintptr(b[1]), a.count, nccl.Float32, nccl.Sum, uintptr(g.stream)); err != nil {
			return err
		}
	}
	return nil
}

func (a *smokeAllReduce) warmUp(g *gpuThread) error {
	if err := a.run(g, 2); err != nil {
		return err
	}
	return g.stream.Synchronize()
}

// time is how long allReduceIters all-reduces take on g's stream.
func (a *smokeAllReduce) time(g *gpuThread) (time.Duration, error) {
	start, err := cudadrv.NewEvent(cudadrv.EventDefault)
	if err != nil {
		return 0, err
	}
	defer start.Destroy()
	end, err := cudadrv.NewEvent(cudadrv.EventDefault)
	if err != nil {
		return 0, err
	}
	defer end.Destroy()
	if err := start.Record(g.stream); err != nil {
		return 0, err
	}
	if err := a.run(g, allReduceIters); err != nil {
		return 0, err
	}
	if err := end.Record(g.stream); err != nil {
		return 0, err
	}
	if err := end.Synchronize(); err != nil {
		return 0, err
	}
	return cudadrv.Elapsed(start, end)
}

// check compares every element of g's result with the sum over the ranks.
func (a *smokeAllReduce) check(g *gpuThread) error {
	n := len(a.threads)
	want := math.Float32bits(float32(n * (n + 1) / 2))
	out := make([]uint32, a.count)
	if err := cudadrv.CopyFromDevice(out, a.bufs[a.rank(g)][1]); err != nil {
		return err
	}
	for i, v := range out {
		if v != want {
			return fmt.Errorf("element %d is %v, want %v", i, math.Float32frombits(v), math.Float32frombits(want))
		}
	}
	return nil
}
