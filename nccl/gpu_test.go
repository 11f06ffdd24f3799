package nccl

// Tests that need NCCL and at least two GPUs. They run one goroutine per GPU,
// each locked to an OS thread with its device's primary context current, and
// skip (saying why) where the driver, NCCL or the GPUs are missing.

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"runtime"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/gotrain/gotrain/gpu/cudadrv"
	"github.com/gotrain/gotrain/internal/testing/gputest"
)

// rank is one GPU's thread.
type rank struct {
	id     int
	dev    cudadrv.Device
	ctx    cudadrv.Context
	stream cudadrv.Stream
	comm   *Comm
	work   chan func()
}

// do runs f on r's locked thread.
func (r *rank) do(f func() error) error {
	done := make(chan error, 1)
	r.work <- func() { done <- f() }
	return <-done
}

// onAll runs f on every rank's thread at once, as collectives need.
func onAll(ranks []*rank, f func(r *rank) error) error {
	errs := make([]error, len(ranks))
	var wg sync.WaitGroup
	for i, r := range ranks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := r.do(func() error { return f(r) }); err != nil {
				errs[i] = fmt.Errorf("rank %d: %w", r.id, err)
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// gpuSetup skips unless NCCL and two GPUs are here; it starts one locked
// thread per GPU with its primary context current and a stream.
func gpuSetup(t *testing.T) (*Library, []*rank) {
	t.Helper()
	drv, err := cudadrv.Load()
	if err != nil {
		gputest.Skipf(t, "needs the CUDA driver and 2 GPUs: %v", err)
	}
	n, err := drv.DeviceCount()
	if err != nil || n < 2 {
		gputest.Skipf(t, "needs 2 GPUs, found %d (%v)", n, err)
	}
	lib, err := Load()
	if err != nil {
		gputest.Skipf(t, "needs NCCL: %v", err)
	}
	ranks := make([]*rank, n)
	for i := range ranks {
		r := &rank{id: i, work: make(chan func())}
		ranks[i] = r
		ready := make(chan error)
		go func() {
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			ready <- func() (err error) {
				if r.dev, err = drv.Device(i); err != nil {
					return err
				}
				if r.ctx, err = r.dev.RetainPrimaryContext(); err != nil {
					return err
				}
				if err = r.ctx.SetCurrent(); err != nil {
					return err
				}
				r.stream, err = cudadrv.NewStream(cudadrv.StreamNonBlocking)
				return err
			}()
			for f := range r.work {
				f()
			}
			r.stream.Destroy()
			r.dev.ReleasePrimaryContext()
		}()
		if err := <-ready; err != nil {
			t.Fatalf("GPU %d: %v", i, err)
		}
	}
	t.Cleanup(func() {
		for _, r := range ranks {
			close(r.work)
		}
	})
	t.Logf("NCCL %s (%s), %d GPUs, CUDA driver %s", lib.Version(), lib.Path(), n, drv.VersionString())
	return lib, ranks
}

// initComms creates one communicator per rank with InitRank, each on its own thread.
func initComms(t *testing.T, lib *Library, ranks []*rank) {
	t.Helper()
	id, err := lib.GetUniqueID()
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	err = onAll(ranks, func(r *rank) (err error) {
		r.comm, err = lib.InitRank(len(ranks), id, r.id)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("InitRank of %d ranks: %v", len(ranks), time.Since(start).Round(time.Millisecond))
	t.Cleanup(func() {
		onAll(ranks, func(r *rank) error { return r.comm.Destroy() })
	})
}

// encode writes v as one element of dt (v must be exact in dt).
func encode(dt DataType, v float64) []byte {
	b := make([]byte, dt.Size())
	switch dt {
	case Int8, Uint8:
		b[0] = byte(int64(v))
	case Int32, Uint32:
		binary.LittleEndian.PutUint32(b, uint32(int64(v)))
	case Int64, Uint64:
		binary.LittleEndian.PutUint64(b, uint64(int64(v)))
	case Float32:
		binary.LittleEndian.PutUint32(b, math.Float32bits(float32(v)))
	case Float64:
		binary.LittleEndian.PutUint64(b, math.Float64bits(v))
	case BFloat16:
		binary.LittleEndian.PutUint16(b, uint16(math.Float32bits(float32(v))>>16))
	case Float16:
		binary.LittleEndian.PutUint16(b, smallFloat(v, 5, 10))
	case Float8E4M3:
		b[0] = byte(smallFloat(v, 4, 3))
	case Float8E5M2:
		b[0] = byte(smallFloat(v, 5, 2))
	}
	return b
}

// smallFloat encodes a normal, exactly representable v with the given
// exponent and mantissa bits (IEEE-style bias; fine for e4m3's normal range).
func smallFloat(v float64, ebits, mbits uint) uint16 {
	if v == 0 {
		return 0
	}
	var sign uint16
	if v < 0 {
		sign, v = 1, -v
	}
	frac, exp := math.Frexp(v) // v = frac × 2^exp, frac in [0.5, 1)
	e := exp - 1 + (1<<(ebits-1) - 1)
	m := uint16((frac*2 - 1) * float64(uint(1)<<mbits))
	return sign<<(ebits+mbits) | uint16(e)<<mbits | m
}

func encodeAll(dt DataType, vs []float64) []byte {
	var out []byte
	for _, v := range vs {
		out = append(out, encode(dt, v)...)
	}
	return out
}

// devBuf holds bytes on the current device.
func devBuf(t *testing.T, host []byte) cudadrv.DevicePtr {
	p, err := cudadrv.MemAlloc(len(host))
	if err != nil {
		t.Error(err)
		return 0
	}
	if err := cudadrv.CopyToDevice(p, host); err != nil {
		t.Error(err)
	}
	return p
}

func readBack(r *rank, p cudadrv.DevicePtr, n int) ([]byte, error) {
	if err := r.stream.Synchronize(); err != nil {
		return nil, err
	}
	out := make([]byte, n)
	return out, cudadrv.CopyFromDevice(out, p)
}

func TestGPUCollectives(t *testing.T) {
	lib, ranks := gpuSetup(t)
	initComms(t, lib, ranks)
	n := len(ranks)

	t.Run("queries", func(t *testing.T) {
		err := onAll(ranks, func(r *rank) error {
			cnt, err1 := r.comm.Count()
			me, err2 := r.comm.UserRank()
			dev, err3 := r.comm.CuDevice()
			if err := errors.Join(err1, err2, err3); err != nil {
				return err
			}
			if cnt != n || me != r.id || dev != int(r.dev) {
				return fmt.Errorf("count %d rank %d device %d; want %d %d %d", cnt, me, dev, n, r.id, r.dev)
			}
			return r.comm.AsyncError()
		})
		if err != nil {
			t.Fatal(err)
		}
	})

	const count = 1000
	// value of element i on rank r: small integers, exact in every type.
	val := func(r, i int) float64 { return float64(i%4 + r + 1) }
	type reduceCase struct {
		dt DataType
		op RedOp
	}
	cases := []reduceCase{
		{Float32, Sum}, {Float32, Avg}, {Float32, Max}, {Float64, Sum}, {Float64, Prod},
		{Int32, Sum}, {Int32, Min}, {Uint32, Max}, {Int64, Sum}, {Uint64, Prod},
		{Int8, Sum}, {Uint8, Max}, {Float16, Sum}, {BFloat16, Sum}, {BFloat16, Min},
		{Float8E4M3, Max}, {Float8E5M2, Min},
	}
	for _, tc := range cases {
		t.Run(fmt.Sprintf("AllReduce/%s/%s", tc.dt, tc.op), func(t *testing.T) {
			want := make([]float64, count)
			for i := range want {
				acc := val(0, i)
				for r := 1; r < n; r++ {
					v := val(r, i)
					switch tc.op {
					case Sum, Avg:
						acc += v
					case Prod:
						acc *= v
					case Max:
						acc = max(acc, v)
					case Min:
						acc = min(acc, v)
					}
				}
				if tc.op == Avg {
					acc /= float64(n)
				}
				want[i] = acc
			}
			wantBytes := encodeAll(tc.dt, want)
			err := onAll(ranks, func(r *rank) error {
				in := make([]float64, count)
				for i := range in {
					in[i] = val(r.id, i)
				}
				send := devBuf(t, encodeAll(tc.dt, in))
				recv := devBuf(t, make([]byte, len(wantBytes)))
				defer send.Free()
				defer recv.Free()
				if err := r.comm.AllReduce(uintptr(send), uintptr(recv), count, tc.dt, tc.op, uintptr(r.stream)); err != nil {
					return err
				}
				got, err := readBack(r, recv, len(wantBytes))
				if err != nil {
					return err
				}
				for i := range got {
					if got[i] != wantBytes[i] {
						e := i / tc.dt.Size()
						return fmt.Errorf("element %d: got bytes % x, want % x (%v)", e, got[e*tc.dt.Size():(e+1)*tc.dt.Size()], wantBytes[e*tc.dt.Size():(e+1)*tc.dt.Size()], want[e])
					}
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
		})
	}

	f32 := func(vs ...float32) []byte {
		b := make([]byte, 4*len(vs))
		for i, v := range vs {
			binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(v))
		}
		return b
	}
	check := func(t *testing.T, name string, f func(r *rank) (got, want []byte, err error)) {
		t.Run(name, func(t *testing.T) {
			err := onAll(ranks, func(r *rank) error {
				got, want, err := f(r)
				if err != nil {
					return err
				}
				if string(got) != string(want) {
					return fmt.Errorf("got % x\nwant % x", got, want)
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
		})
	}
	const k = 257
	rankVals := func(r int) []float32 {
		v := make([]float32, k)
		for i := range v {
			v[i] = float32(r*1000 + i)
		}
		return v
	}
	check(t, "Broadcast", func(r *rank) ([]byte, []byte, error) {
		root := n - 1
		buf := devBuf(t, f32(rankVals(r.id)...))
		defer buf.Free()
		if err := r.comm.Broadcast(uintptr(buf), uintptr(buf), k, Float32, root, uintptr(r.stream)); err != nil {
			return nil, nil, err
		}
		got, err := readBack(r, buf, 4*k)
		return got, f32(rankVals(root)...), err
	})
	check(t, "Reduce", func(r *rank) ([]byte, []byte, error) {
		send := devBuf(t, f32(rankVals(r.id)...))
		recv := devBuf(t, make([]byte, 4*k))
		defer send.Free()
		defer recv.Free()
		if err := r.comm.Reduce(uintptr(send), uintptr(recv), k, Float32, Sum, 0, uintptr(r.stream)); err != nil {
			return nil, nil, err
		}
		got, err := readBack(r, recv, 4*k)
		want := make([]float32, k)
		if r.id == 0 {
			for q := 0; q < n; q++ {
				for i, v := range rankVals(q) {
					want[i] += v
				}
			}
		}
		return got, f32(want...), err
	})
	check(t, "AllGather", func(r *rank) ([]byte, []byte, error) {
		send := devBuf(t, f32(rankVals(r.id)...))
		recv := devBuf(t, make([]byte, 4*k*n))
		defer send.Free()
		defer recv.Free()
		if err := r.comm.AllGather(uintptr(send), uintptr(recv), k, Float32, uintptr(r.stream)); err != nil {
			return nil, nil, err
		}
		got, err := readBack(r, recv, 4*k*n)
		var want []float32
		for q := 0; q < n; q++ {
			want = append(want, rankVals(q)...)
		}
		return got, f32(want...), err
	})
	check(t, "ReduceScatter", func(r *rank) ([]byte, []byte, error) {
		in := make([]float32, k*n)
		for i := range in {
			in[i] = float32(r.id + i)
		}
		send := devBuf(t, f32(in...))
		recv := devBuf(t, make([]byte, 4*k))
		defer send.Free()
		defer recv.Free()
		if err := r.comm.ReduceScatter(uintptr(send), uintptr(recv), k, Float32, Sum, uintptr(r.stream)); err != nil {
			return nil, nil, err
		}
		got, err := readBack(r, recv, 4*k)
		want := make([]float32, k)
		for i := range want {
			for q := 0; q < n; q++ {
				want[i] += float32(q + r.id*k + i)
			}
		}
		return got, f32(want...), err
	})
	check(t, "SendRecvRing", func(r *rank) ([]byte, []byte, error) {
		next, prev := (r.id+1)%n, (r.id+n-1)%n
		send := devBuf(t, f32(rankVals(r.id)...))
		recv := devBuf(t, make([]byte, 4*k))
		defer send.Free()
		defer recv.Free()
		err := lib.Group(func() error {
			return errors.Join(
				r.comm.Send(uintptr(send), k, Float32, next, uintptr(r.stream)),
				r.comm.Recv(uintptr(recv), k, Float32, prev, uintptr(r.stream)))
		})
		if err != nil {
			return nil, nil, err
		}
		got, err := readBack(r, recv, 4*k)
		return got, f32(rankVals(prev)...), err
	})
	t.Run("BadArgumentCarriesNCCLMessage", func(t *testing.T) {
		r := ranks[0]
		err := r.do(func() error {
			return r.comm.AllReduce(0, 0, 16, DataType(99), Sum, uintptr(r.stream))
		})
		var ne *Error
		if !errors.As(err, &ne) || !errors.Is(err, InvalidArgument) || ne.Message == "" {
			t.Fatalf("AllReduce with a bad type: %v", err)
		}
		t.Logf("NCCL's error: %v", err)
	})

	t.Run("Latency", func(t *testing.T) { measureLatency(t, ranks) })
}

// measureLatency times all-reduce (float32 sum, in place) with a stream
// synchronize after each call, like nccl-tests with one thread per GPU.
func measureLatency(t *testing.T, ranks []*rank) {
	for _, size := range []int{8, 8 << 10, 2 << 20} {
		count := size / 4
		iters := 2000
		if size >= 1<<20 {
			iters = 300
		}
		per := make([]time.Duration, len(ranks))
		launch := make([]time.Duration, len(ranks))
		piped := make([]time.Duration, len(ranks))
		err := onAll(ranks, func(r *rank) error {
			buf, err := cudadrv.MemAlloc(size)
			if err != nil {
				return err
			}
			defer buf.Free()
			if err := cudadrv.MemsetD8(buf, 0, size); err != nil {
				return err
			}
			s := uintptr(r.stream)
			for i := 0; i < 100; i++ {
				if err := r.comm.AllReduce(uintptr(buf), uintptr(buf), count, Float32, Sum, s); err != nil {
					return err
				}
			}
			if err := r.stream.Synchronize(); err != nil {
				return err
			}
			var inCall time.Duration
			start := time.Now()
			for i := 0; i < iters; i++ {
				t0 := time.Now()
				if err := r.comm.AllReduce(uintptr(buf), uintptr(buf), count, Float32, Sum, s); err != nil {
					return err
				}
				inCall += time.Since(t0)
				if err := r.stream.Synchronize(); err != nil {
					return err
				}
			}
			per[r.id] = time.Since(start) / time.Duration(iters)
			launch[r.id] = inCall / time.Duration(iters)
			// Back to back, one synchronize at the end: nccl-tests' way.
			start = time.Now()
			for i := 0; i < iters; i++ {
				if err := r.comm.AllReduce(uintptr(buf), uintptr(buf), count, Float32, Sum, s); err != nil {
					return err
				}
			}
			if err := r.stream.Synchronize(); err != nil {
				return err
			}
			piped[r.id] = time.Since(start) / time.Duration(iters)
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		worst := slicesMax(per)
		busbw := float64(size) * 2 * float64(len(ranks)-1) / float64(len(ranks)) / worst.Seconds() / 1e9
		t.Logf("all-reduce %8d B: back to back %v/op; with a sync after each %v/op (busbw %.1f GB/s), %v of it inside ncclAllReduce",
			size, slicesMax(piped).Round(10*time.Nanosecond), worst.Round(10*time.Nanosecond), busbw, slicesMax(launch).Round(10*time.Nanosecond))
	}
	// The cost of one cgo call through the shim into NCCL, on a trivial query.
	r := ranks[0]
	r.do(func() error {
		const k = 100000
		start := time.Now()
		for i := 0; i < k; i++ {
			r.comm.Count()
		}
		t.Logf("ncclCommCount through the shim: %v per call", time.Since(start)/k)
		return nil
	})
}

func slicesMax(ds []time.Duration) time.Duration {
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[len(s)-1]
}

// TestGPUGroupedInit creates every rank's communicator from one thread in a
// group, then runs an all-reduce across devices from that thread.
func TestGPUGroupedInit(t *testing.T) {
	lib, ranks := gpuSetup(t)
	id, err := lib.GetUniqueID()
	if err != nil {
		t.Fatal(err)
	}
	comms := make([]*Comm, len(ranks))
	bufs := make([]cudadrv.DevicePtr, len(ranks))
	const count = 64
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	err = lib.Group(func() error {
		for i, r := range ranks {
			if err := r.ctx.SetCurrent(); err != nil {
				return err
			}
			c, err := lib.InitRank(len(ranks), id, i)
			if err != nil {
				return err
			}
			comms[i] = c
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		for _, c := range comms {
			c.Destroy()
		}
	}()
	streams := make([]cudadrv.Stream, len(ranks))
	for i, r := range ranks {
		r.ctx.SetCurrent()
		if bufs[i], err = cudadrv.MemAlloc(4 * count); err != nil {
			t.Fatal(err)
		}
		defer bufs[i].Free()
		cudadrv.MemsetD32(bufs[i], math.Float32bits(float32(i+1)), count)
		if streams[i], err = cudadrv.NewStream(cudadrv.StreamNonBlocking); err != nil {
			t.Fatal(err)
		}
		defer streams[i].Destroy()
	}
	err = lib.Group(func() error {
		for i, r := range ranks {
			r.ctx.SetCurrent()
			if err := comms[i].AllReduce(uintptr(bufs[i]), uintptr(bufs[i]), count, Float32, Sum, uintptr(streams[i])); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	want := float32(len(ranks) * (len(ranks) + 1) / 2)
	for i, r := range ranks {
		r.ctx.SetCurrent()
		if err := streams[i].Synchronize(); err != nil {
			t.Fatal(err)
		}
		got := make([]float32, count)
		if err := cudadrv.CopyFromDevice(got, bufs[i]); err != nil {
			t.Fatal(err)
		}
		for j, v := range got {
			if v != want {
				t.Fatalf("GPU %d element %d: %v, want %v", i, j, v, want)
			}
		}
	}
}

// allReduceCheck runs a float32 sum on every rank with c(r) and checks it.
func allReduceCheck(ranks []*rank, c func(r *rank) *Comm) error {
	const count = 1024
	return onAll(ranks, func(r *rank) error {
		cm := c(r)
		if cm == nil {
			return nil
		}
		size, err := cm.Count()
		if err != nil {
			return err
		}
		me, _ := cm.UserRank()
		buf, err := cudadrv.MemAlloc(4 * count)
		if err != nil {
			return err
		}
		defer buf.Free()
		cudadrv.MemsetD32(buf, math.Float32bits(float32(me+1)), count)
		err = cm.AllReduce(uintptr(buf), uintptr(buf), count, Float32, Sum, uintptr(r.stream))
		if errors.Is(err, InProgress) {
			err = cm.Wait(context.Background())
		}
		if err != nil {
			return err
		}
		got, err := readBack(r, buf, 4*count)
		if err != nil {
			return err
		}
		want := math.Float32bits(float32(size * (size + 1) / 2))
		if v := binary.LittleEndian.Uint32(got); v != want {
			return fmt.Errorf("got %v, want %v", math.Float32frombits(v), math.Float32frombits(want))
		}
		return nil
	})
}

// TestGPUConfigSplitScalable covers the newer init paths: non-blocking
// InitRankConfig, Split, InitRankScalable, Finalize and Abort.
func TestGPUConfigSplitScalable(t *testing.T) {
	lib, ranks := gpuSetup(t)
	n := len(ranks)
	if !lib.Has("ncclCommInitRankConfig") {
		gputest.Skipf(t, "NCCL %s lacks ncclCommInitRankConfig", lib.Version())
	}
	id, err := lib.GetUniqueID()
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	cfg := &Config{NonBlocking: true, CommName: "gotrain-test"}
	err = onAll(ranks, func(r *rank) (err error) {
		r.comm, err = lib.InitRankConfig(t.Context(), n, id, r.id, cfg)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("non-blocking InitRankConfig: %v", time.Since(start).Round(time.Millisecond))
	if err := allReduceCheck(ranks, func(r *rank) *Comm { return r.comm }); err != nil {
		t.Fatalf("non-blocking comm: %v", err)
	}

	if lib.Has("ncclCommSplit") {
		split := make([]*Comm, n)
		// Every rank in one color, ordered in reverse.
		err = onAll(ranks, func(r *rank) (err error) {
			split[r.id], err = r.comm.Split(t.Context(), 0, n-r.id, &Config{})
			return err
		})
		if err != nil {
			t.Fatalf("Split: %v", err)
		}
		if me, _ := split[0].UserRank(); me != n-1 {
			t.Errorf("rank 0 of the reversed split is rank %d there, want %d", me, n-1)
		}
		if err := allReduceCheck(ranks, func(r *rank) *Comm { return split[r.id] }); err != nil {
			t.Fatalf("split comm: %v", err)
		}
		// A rank with no color gets no communicator.
		err = onAll(ranks, func(r *rank) error {
			color := 0
			if r.id == n-1 {
				color = SplitNoColor
			}
			c, err := r.comm.Split(t.Context(), color, r.id, nil)
			if err != nil {
				return err
			}
			if (c == nil) != (r.id == n-1) {
				return fmt.Errorf("color %d gave comm %v", color, c)
			}
			if c != nil {
				return c.Destroy()
			}
			return nil
		})
		if err != nil {
			t.Fatalf("Split with SplitNoColor: %v", err)
		}
		if err := onAll(ranks, func(r *rank) error { return split[r.id].Abort() }); err != nil {
			t.Fatalf("Abort: %v", err)
		}
		if err := split[0].AllReduce(0, 0, 1, Float32, Sum, 0); !errors.Is(err, ErrClosed) {
			t.Errorf("AllReduce after Abort: %v, want ErrClosed", err)
		}
	}
	if lib.Has("ncclCommFinalize") {
		err = onAll(ranks, func(r *rank) error {
			return errors.Join(r.comm.Finalize(t.Context()), r.comm.Destroy())
		})
		if err != nil {
			t.Fatalf("Finalize+Destroy: %v", err)
		}
	}

	if lib.Has("ncclCommInitRankScalable") {
		ids := make([]UniqueID, 2)
		for i := range ids {
			if ids[i], err = lib.GetUniqueID(); err != nil {
				t.Fatal(err)
			}
		}
		scal := make([]*Comm, n)
		err = onAll(ranks, func(r *rank) (err error) {
			scal[r.id], err = lib.InitRankScalable(t.Context(), n, r.id, ids[:min(len(ids), n)], nil)
			return err
		})
		if err != nil {
			t.Fatalf("InitRankScalable: %v", err)
		}
		if err := allReduceCheck(ranks, func(r *rank) *Comm { return scal[r.id] }); err != nil {
			t.Fatalf("scalable comm: %v", err)
		}
		onAll(ranks, func(r *rank) error { return scal[r.id].Destroy() })
	} else {
		t.Logf("NCCL %s lacks ncclCommInitRankScalable", lib.Version())
	}
}
