package benchrun

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"runtime"
	"sync"
	"time"
	"unsafe"

	"github.com/gotrain/gotrain/gpu/cudadrv"
	"github.com/gotrain/gotrain/nccl"
	"github.com/gotrain/gotrain/worker/comm"
	"github.com/gotrain/gotrain/worker/ncclcomm"
)

// engine runs one backend's collectives for Run.
type engine interface {
	// setup allocates send and recv for the largest shape and fills send
	// with host's bytes.
	setup(host []byte, recvBytes int64) error
	// run clears recv, runs warmup then iters collectives of sh and returns
	// the time of one.
	run(ctx context.Context, sh Shape) (time.Duration, error)
	// result copies the first len(dst) bytes of recv into dst.
	result(dst []byte) error
	close()
}

// Run measures s on c, a communicator over every rank of the job, and
// returns the Report on rank 0 (nil on the other ranks). backend is the name
// the report shows. A NCCL communicator (*ncclcomm.Comm, possibly wrapped:
// see unwrap) gets device buffers and CUDA-event timing; any other gets host
// buffers and the wall clock.
func Run(ctx context.Context, c comm.Comm, backend string, s Spec, log *slog.Logger) (*Report, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	n, me := c.Size(), c.Rank()
	if err := s.Validate(n); err != nil {
		return nil, err
	}
	shapes := s.Shapes(n)
	if len(shapes) == 0 {
		return nil, errors.New("no sizes between --min and --max")
	}
	dt := s.dtype()
	esz := int64(dt.Size())
	last := shapes[len(shapes)-1]
	rep := &Report{Spec: s, Backend: backend, Ranks: n}

	var eng engine
	if nc := unwrapNCCL(c); nc != nil {
		g := &gpuEngine{c: nc, s: s, esz: esz}
		eng = g
		rep.NCCL = nc.Library().Version().String()
		if name, err := gpuName(nc); err == nil {
			rep.Devices = []string{name}
		}
	} else {
		eng = &hostEngine{c: c, s: s}
	}
	start := time.Now()
	host := make([]byte, last.SendCount*esz)
	fillPattern(dt, host, me)
	if err := eng.setup(host, last.RecvCount*esz); err != nil {
		return nil, fmt.Errorf("rank %d: set up buffers: %w", me, err)
	}
	defer eng.close()
	host = nil
	log.Debug("buffers ready", "send_bytes", last.SendCount*esz, "recv_bytes", last.RecvCount*esz, "took", time.Since(start))

	check := make([]byte, last.RecvCount*esz)
	// stats holds each size's time (seconds), then each size's #wrong, so
	// that one all-reduce gathers both.
	stats := make([]float64, 2*len(shapes))
	// One untimed pass at the smallest size: the first collectives of a new
	// communicator connect to the peers.
	if _, err := eng.run(ctx, shapes[0]); err != nil {
		return nil, fmt.Errorf("rank %d: warm up: %w", me, err)
	}
	for i, sh := range shapes {
		per, err := eng.run(ctx, sh)
		if err != nil {
			return nil, fmt.Errorf("rank %d: %s of %d bytes: %w", me, s.Op, sh.Bytes, err)
		}
		got := check[:sh.RecvCount*esz]
		if err := eng.result(got); err != nil {
			return nil, fmt.Errorf("rank %d: read the result of %d bytes: %w", me, sh.Bytes, err)
		}
		stats[i] = per.Seconds()
		stats[len(shapes)+i] = float64(countWrong(dt, got, expect(s, sh, n, me)))
	}
	if err := c.AllReduce(ctx, comm.Host(stats), comm.Host(stats), comm.Sum); err != nil {
		return nil, fmt.Errorf("rank %d: gather the results: %w", me, err)
	}
	if me != 0 {
		return nil, nil
	}
	redop := "none"
	if s.reduces() {
		redop = s.RedOp
	}
	root := -1
	if s.Op == Broadcast {
		root = s.Root
	}
	for i, sh := range shapes {
		sec := stats[i] / float64(n)
		algbw := float64(sh.Bytes) / sec / 1e9
		rep.Rows = append(rep.Rows, Row{
			Op: s.Op, Bytes: sh.Bytes, Count: sh.Count, Type: s.DType, RedOp: redop, Root: root,
			TimeUs: sec * 1e6, AlgBW: algbw, BusBW: algbw * BusFactor(s.Op, n),
			Wrong: int64(stats[len(shapes)+i]), Ranks: n, Backend: backend,
		})
	}
	return rep, nil
}

// unwrapNCCL finds the *ncclcomm.Comm in c, looking through wrappers that
// have an Unwrap() comm.Comm method.
func unwrapNCCL(c comm.Comm) *ncclcomm.Comm {
	for c != nil {
		if nc, ok := c.(*ncclcomm.Comm); ok {
			return nc
		}
		u, ok := c.(interface{ Unwrap() comm.Comm })
		if !ok {
			return nil
		}
		c = u.Unwrap()
	}
	return nil
}

func gpuName(c *ncclcomm.Comm) (string, error) {
	d, err := cudadrv.Load()
	if err != nil {
		return "", err
	}
	dev, err := d.Device(c.Device())
	if err != nil {
		return "", err
	}
	return dev.Name()
}

// val is element i of rank r's input: small integers, exact in every dtype
// and in every sum over up to 2^19 ranks.
func val(r int, i int64) float64 { return float64(1 + (i+5*int64(r))%23) }

// expect returns the value element i of rank me's recv must hold after the
// collective.
func expect(s Spec, sh Shape, n, me int) func(i int64) float64 {
	red := func(i int64) float64 {
		vals := make([]float64, n)
		for q := range vals {
			vals[q] = val(q, i)
		}
		return reduceVals(s.redOp(), vals, s.dtype())
	}
	// A reduction's result depends on i only through i mod 23.
	var table [23]float64
	for m := range table {
		table[m] = red(int64(m))
	}
	switch s.Op {
	case AllReduce:
		return func(i int64) float64 { return table[i%23] }
	case ReduceScatter:
		off := int64(me) * sh.RecvCount
		return func(i int64) float64 { return table[(off+i)%23] }
	case AllGather:
		return func(i int64) float64 { return val(int(i/sh.SendCount), i%sh.SendCount) }
	default: // Broadcast
		return func(i int64) float64 { return val(s.Root, i) }
	}
}

func reduceVals(op comm.Op, vals []float64, dt comm.DType) float64 {
	acc := vals[0]
	for _, v := range vals[1:] {
		switch op {
		case comm.Sum, comm.Avg:
			acc += v
		case comm.Max:
			acc = max(acc, v)
		case comm.Min:
			acc = min(acc, v)
		}
	}
	if op == comm.Avg {
		acc /= float64(len(vals))
		if dt == comm.Int32 || dt == comm.Int64 {
			acc = math.Trunc(acc)
		}
	}
	return acc
}

func typed[T comm.Element](b []byte) []T {
	var z T
	if len(b) == 0 {
		return nil
	}
	return unsafe.Slice((*T)(unsafe.Pointer(unsafe.SliceData(b))), len(b)/int(unsafe.Sizeof(z)))
}

// parallel runs f over [0, n) in chunks on every CPU.
func parallel(n int64, f func(lo, hi int64)) {
	workers := int64(runtime.GOMAXPROCS(0))
	if n < 1<<16 || workers == 1 {
		f(0, n)
		return
	}
	chunk := (n + workers - 1) / workers
	var wg sync.WaitGroup
	for lo := int64(0); lo < n; lo += chunk {
		wg.Add(1)
		go func() { defer wg.Done(); f(lo, min(lo+chunk, n)) }()
	}
	wg.Wait()
}

// fillPattern writes rank's input into b, as elements of dt.
func fillPattern(dt comm.DType, b []byte, rank int) {
	switch dt {
	case comm.Float32:
		fillT(typed[float32](b), rank)
	case comm.Float64:
		fillT(typed[float64](b), rank)
	case comm.Int32:
		fillT(typed[int32](b), rank)
	case comm.Int64:
		fillT(typed[int64](b), rank)
	}
}

func fillT[T comm.Element](s []T, rank int) {
	parallel(int64(len(s)), func(lo, hi int64) {
		for i := lo; i < hi; i++ {
			s[i] = T(val(rank, i))
		}
	})
}

// countWrong counts the elements of b (as dt) that differ from want, with a
// relative tolerance for floating point (an average may round).
func countWrong(dt comm.DType, b []byte, want func(int64) float64) int64 {
	switch dt {
	case comm.Float32:
		return wrongT(typed[float32](b), want, 1e-6)
	case comm.Float64:
		return wrongT(typed[float64](b), want, 1e-12)
	case comm.Int32:
		return wrongT(typed[int32](b), want, 0)
	case comm.Int64:
		return wrongT(typed[int64](b), want, 0)
	}
	return int64(len(b))
}

func wrongT[T comm.Element](s []T, want func(int64) float64, tol float64) int64 {
	var mu sync.Mutex
	var total int64
	parallel(int64(len(s)), func(lo, hi int64) {
		var bad int64
		for i := lo; i < hi; i++ {
			w := want(i)
			if d := math.Abs(float64(s[i]) - w); d > tol*math.Abs(w) || d != d {
				bad++
			}
		}
		mu.Lock()
		total += bad
		mu.Unlock()
	})
	return total
}

// hostEngine runs the collectives of comm.Comm on host buffers (the CPU
// backend), timed with the wall clock.
type hostEngine struct {
	c          comm.Comm
	s          Spec
	send, recv comm.Buffer
}

func hostBuffer(dt comm.DType, count int64) comm.Buffer {
	switch dt {
	case comm.Float64:
		return comm.Host(make([]float64, count))
	case comm.Int32:
		return comm.Host(make([]int32, count))
	case comm.Int64:
		return comm.Host(make([]int64, count))
	}
	return comm.Host(make([]float32, count))
}

func (h *hostEngine) setup(host []byte, recvBytes int64) error {
	dt := h.s.dtype()
	h.send = hostBuffer(dt, int64(len(host))/int64(dt.Size()))
	copy(h.send.HostBytes(), host)
	h.recv = hostBuffer(dt, recvBytes/int64(dt.Size()))
	return nil
}

func (h *hostEngine) run(ctx context.Context, sh Shape) (time.Duration, error) {
	send, recv := h.send.Slice(0, int(sh.SendCount)), h.recv.Slice(0, int(sh.RecvCount))
	clear(recv.HostBytes())
	op := h.s.redOp()
	call := func() error {
		switch h.s.Op {
		case AllReduce:
			return h.c.AllReduce(ctx, send, recv, op)
		case AllGather:
			return h.c.AllGather(ctx, send, recv)
		case ReduceScatter:
			return h.c.ReduceScatter(ctx, send, recv, op)
		}
		// Broadcast out of place: root's input into every recv.
		if h.c.Rank() == h.s.Root {
			copy(recv.HostBytes(), send.HostBytes())
		}
		return h.c.Broadcast(ctx, recv, h.s.Root)
	}
	for range h.s.Warmup {
		if err := call(); err != nil {
			return 0, err
		}
	}
	if err := h.c.Barrier(ctx); err != nil {
		return 0, err
	}
	start := time.Now()
	for range h.s.Iters {
		if err := call(); err != nil {
			return 0, err
		}
	}
	return time.Since(start) / time.Duration(h.s.Iters), nil
}

func (h *hostEngine) result(dst []byte) error {
	copy(dst, h.recv.HostBytes())
	return nil
}

func (h *hostEngine) close() {}

// gpuEngine runs NCCL collectives on device buffers, on the communicator's
// thread and stream, timed with CUDA events: one cgo call per collective and
// no synchronization between them, as nccl-tests does.
type gpuEngine struct {
	c          *ncclcomm.Comm
	s          Spec
	esz        int64
	send, recv cudadrv.DevicePtr
	sync       cudadrv.DevicePtr
	start, end cudadrv.Event
}

func (g *gpuEngine) setup(host []byte, recvBytes int64) error {
	return g.c.Do(func() (err error) {
		if g.send, err = cudadrv.MemAlloc(max(len(host), 4)); err != nil {
			return err
		}
		if g.recv, err = cudadrv.MemAlloc(int(max(recvBytes, 4))); err != nil {
			return err
		}
		if g.sync, err = cudadrv.MemAlloc(4); err != nil {
			return err
		}
		if g.start, err = cudadrv.NewEvent(cudadrv.EventDefault); err != nil {
			return err
		}
		if g.end, err = cudadrv.NewEvent(cudadrv.EventDefault); err != nil {
			return err
		}
		return cudadrv.CopyToDevice(g.send, host)
	})
}

func (g *gpuEngine) run(ctx context.Context, sh Shape) (time.Duration, error) {
	var per time.Duration
	err := g.c.Do(func() error {
		nc, st := g.c.NCCL(), cudadrv.Stream(g.c.Stream())
		s, send, recv := uintptr(st), uintptr(g.send), uintptr(g.recv)
		dt, err := ncclcomm.NCCLType(g.s.dtype())
		if err != nil {
			return err
		}
		op, err := ncclcomm.NCCLOp(g.s.redOp())
		if err != nil {
			return err
		}
		var call func() error
		switch g.s.Op {
		case AllReduce:
			n := int(sh.Count)
			call = func() error { return nc.AllReduce(send, recv, n, dt, op, s) }
		case AllGather:
			n := int(sh.SendCount)
			call = func() error { return nc.AllGather(send, recv, n, dt, s) }
		case ReduceScatter:
			n := int(sh.RecvCount)
			call = func() error { return nc.ReduceScatter(send, recv, n, dt, op, s) }
		default:
			n, root := int(sh.Count), g.s.Root
			call = func() error { return nc.Broadcast(send, recv, n, dt, root, s) }
		}
		if launch := call; nc.NonBlocking() {
			call = func() error {
				err := launch()
				if errors.Is(err, nccl.InProgress) {
					err = nc.Wait(ctx)
				}
				return err
			}
		}
		if err := cudadrv.MemsetD8Async(g.recv, 0, int(sh.RecvCount*g.esz), st); err != nil {
			return err
		}
		for range g.s.Warmup {
			if err := call(); err != nil {
				return err
			}
		}
		// Line the ranks up: a one-element all-reduce, waited for on the host.
		if err := nc.AllReduce(uintptr(g.sync), uintptr(g.sync), 1, nccl.Int32, nccl.Sum, s); err != nil {
			return err
		}
		if err := st.Synchronize(); err != nil {
			return err
		}
		if err := g.start.Record(st); err != nil {
			return err
		}
		for range g.s.Iters {
			if err := call(); err != nil {
				return err
			}
		}
		if err := g.end.Record(st); err != nil {
			return err
		}
		if err := g.end.Synchronize(); err != nil {
			return err
		}
		el, err := cudadrv.Elapsed(g.start, g.end)
		per = el / time.Duration(g.s.Iters)
		return err
	})
	return per, err
}

func (g *gpuEngine) result(dst []byte) error {
	return g.c.Do(func() error { return cudadrv.CopyFromDevice(dst, g.recv) })
}

func (g *gpuEngine) close() {
	g.c.Do(func() error {
		for _, p := range []cudadrv.DevicePtr{g.send, g.recv, g.sync} {
			if p != 0 {
				p.Free()
			}
		}
		for _, e := range []cudadrv.Event{g.start, g.end} {
			if e != 0 {
				e.Destroy()
			}
		}
		return nil
	})
}
