package cpucomm

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gotrain/gotrain/worker/comm"
	"github.com/gotrain/gotrain/worker/comm/commtest"
)

// newMesh starts size ranks over loopback, as goroutines, and closes them
// when the test ends.
func newMesh(t testing.TB, size int) []*Comm {
	t.Helper()
	store := commtest.NewMemStore()
	comms := make([]*Comm, size)
	errs := make([]error, size)
	var wg sync.WaitGroup
	for r := range size {
		wg.Go(func() {
			comms[r], errs[r] = New(t.Context(), Config{Name: "test", Generation: 1, Rank: r, Size: size, Host: "127.0.0.1", Store: store})
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, c := range comms {
			c.Close()
		}
	})
	return comms
}

// onAll runs f on every rank at once and returns the ranks' errors.
func onAll(comms []*Comm, f func(r int, c *Comm) error) []error {
	errs := make([]error, len(comms))
	var wg sync.WaitGroup
	for r, c := range comms {
		wg.Go(func() { errs[r] = f(r, c) })
	}
	wg.Wait()
	return errs
}

func mustAll(t *testing.T, errs []error) {
	t.Helper()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
}

// tuning is a set of thresholds that steers the collectives to one algorithm.
type tuning struct {
	name      string
	directMax int
	chunk     int
}

var (
	defaults = tuning{"default", directMaxBytes, chunkBytes}
	// ring forces the ring and the chain, with chunks of a few elements, so
	// that small buffers exercise pipelining and empty segments.
	ring = tuning{"ring", 0, 24}
)

func (tu tuning) apply(comms []*Comm) {
	for _, c := range comms {
		c.directMax, c.chunk = tu.directMax, tu.chunk
	}
}

type elem interface {
	float32 | float64 | int32 | int64
}

// data returns integer-valued elements, negative and positive, so that float
// sums are exact and integer Avg truncates both ways.
func data[T elem](n, rank, salt int) []T {
	s := make([]T, n)
	for i := range s {
		s[i] = T((i*7+rank*13+salt)%17 - 8)
	}
	return s
}

func reference[T elem](op comm.Op, in [][]T) []T {
	out := slices.Clone(in[0])
	for _, x := range in[1:] {
		for i, v := range x {
			switch op {
			case comm.Sum, comm.Avg:
				out[i] += v
			case comm.Max:
				out[i] = max(out[i], v)
			case comm.Min:
				out[i] = min(out[i], v)
			}
		}
	}
	if op == comm.Avg {
		for i := range out {
			out[i] /= T(len(in))
		}
	}
	return out
}

var (
	dtypes = []comm.DType{comm.Float32, comm.Float64, comm.Int32, comm.Int64}
	ops    = []comm.Op{comm.Sum, comm.Avg, comm.Max, comm.Min}
	sizes  = []int{1, 2, 3, 4, 7}
)

func counts(t *testing.T) []int {
	if testing.Short() {
		return []int{1, 2, 7, 1000, 65537}
	}
	return []int{1, 2, 7, 1000, 65537, 1 << 20}
}

// forEachSetup runs f for every world size and tuning, with count elements.
// The ring tuning takes only small counts: it cuts buffers into tiny chunks.
func forEachSetup(t *testing.T, f func(t *testing.T, comms []*Comm, count int)) {
	for _, size := range sizes {
		t.Run(fmt.Sprintf("size=%d", size), func(t *testing.T) {
			comms := newMesh(t, size)
			for _, tu := range []tuning{defaults, ring} {
				tu.apply(comms)
				for _, count := range counts(t) {
					if tu == ring && count > 1000 {
						continue
					}
					t.Run(fmt.Sprintf("%s/count=%d", tu.name, count), func(t *testing.T) { f(t, comms, count) })
				}
			}
		})
	}
}

// reduceDTypes are the dtypes a reduction is checked with at count
// elements. Under the race detector (make test-race), which slows the
// element loops about twentyfold, counts above 1000 take float64 only: the
// detector looks at what goroutines share, which the dtype does not change,
// and 65537 float64s still span two chunks of the pipeline. The plain pass
// checks every dtype at every count.
func reduceDTypes(count int) []comm.DType {
	if raceDetector && count > 1000 {
		return []comm.DType{comm.Float64}
	}
	return dtypes
}

func TestAllReduce(t *testing.T) {
	forEachSetup(t, func(t *testing.T, comms []*Comm, count int) {
		for i, dt := range reduceDTypes(count) {
			for j, op := range ops {
				inPlace := (i+j)%2 == 1
				switch dt {
				case comm.Float32:
					checkAllReduce[float32](t, comms, op, count, inPlace)
				case comm.Float64:
					checkAllReduce[float64](t, comms, op, count, inPlace)
				case comm.Int32:
					checkAllReduce[int32](t, comms, op, count, inPlace)
				case comm.Int64:
					checkAllReduce[int64](t, comms, op, count, inPlace)
				}
			}
		}
	})
}

func checkAllReduce[T elem](t *testing.T, comms []*Comm, op comm.Op, count int, inPlace bool) {
	t.Helper()
	P := len(comms)
	in := make([][]T, P)
	out := make([][]T, P)
	for r := range P {
		in[r] = data[T](count, r, int(op))
		if inPlace {
			out[r] = slices.Clone(in[r])
		} else {
			out[r] = make([]T, count)
		}
	}
	want := reference(op, in)
	mustAll(t, onAll(comms, func(r int, c *Comm) error {
		send := comm.Host(in[r])
		if inPlace {
			send = comm.Host(out[r])
		}
		return c.AllReduce(t.Context(), send, comm.Host(out[r]), op)
	}))
	for r := range P {
		if !bytes.Equal(comm.Host(out[r]).HostBytes(), comm.Host(want).HostBytes()) {
			i := firstDiff(out[r], want)
			t.Fatalf("%s %s in-place=%v: rank %d element %d = %v, want %v", comm.Host(want).DType(), op, inPlace, r, i, out[r][i], want[i])
		}
	}
}

func firstDiff[T elem](a, b []T) int {
	for i := range a {
		if a[i] != b[i] {
			return i
		}
	}
	return -1
}

func TestBroadcast(t *testing.T) {
	forEachSetup(t, func(t *testing.T, comms []*Comm, count int) {
		P := len(comms)
		for _, root := range []int{0, P - 1} {
			for _, dt := range dtypes {
				bufs := make([][]int64, P) // one backing type; the dtype only scales the byte count
				n := count * dt.Size() / 8
				if n == 0 {
					n = 1
				}
				for r := range P {
					bufs[r] = data[int64](n, r, root)
				}
				want := slices.Clone(bufs[root])
				mustAll(t, onAll(comms, func(r int, c *Comm) error {
					return c.Broadcast(t.Context(), comm.Host(bufs[r]), root)
				}))
				for r := range P {
					if !slices.Equal(bufs[r], want) {
						t.Fatalf("root %d %s: rank %d differs at element %d", root, dt, r, firstDiff(bufs[r], want))
					}
				}
			}
		}
	})
}

// perRank is the per-rank count for allgather and reducescatter, which move
// size × count elements.
func perRank(count, size int) int {
	if count > 65537 {
		return count / size
	}
	return count
}

func TestAllGather(t *testing.T) {
	forEachSetup(t, func(t *testing.T, comms []*Comm, count int) {
		P := len(comms)
		n := perRank(count, P)
		for _, inPlace := range []bool{false, true} {
			in := make([][]float32, P)
			out := make([][]float32, P)
			var want []float32
			for r := range P {
				in[r] = data[float32](n, r, 3)
				want = append(want, in[r]...)
				out[r] = make([]float32, P*n)
				if inPlace {
					copy(out[r][r*n:], in[r])
				}
			}
			mustAll(t, onAll(comms, func(r int, c *Comm) error {
				send := comm.Host(in[r])
				if inPlace {
					send = comm.Host(out[r]).Slice(r*n, (r+1)*n)
				}
				return c.AllGather(t.Context(), send, comm.Host(out[r]))
			}))
			for r := range P {
				if !slices.Equal(out[r], want) {
					t.Fatalf("in-place=%v: rank %d differs at element %d", inPlace, r, firstDiff(out[r], want))
				}
			}
		}
	})
}

func TestReduceScatter(t *testing.T) {
	forEachSetup(t, func(t *testing.T, comms []*Comm, count int) {
		for i, dt := range reduceDTypes(count) {
			for j, op := range ops {
				inPlace := (i+j)%2 == 0
				switch dt {
				case comm.Float32:
					checkReduceScatter[float32](t, comms, op, count, inPlace)
				case comm.Float64:
					checkReduceScatter[float64](t, comms, op, count, inPlace)
				case comm.Int32:
					checkReduceScatter[int32](t, comms, op, count, inPlace)
				case comm.Int64:
					checkReduceScatter[int64](t, comms, op, count, inPlace)
				}
			}
		}
	})
}

func checkReduceScatter[T elem](t *testing.T, comms []*Comm, op comm.Op, count int, inPlace bool) {
	t.Helper()
	P := len(comms)
	n := perRank(count, P)
	in := make([][]T, P)
	out := make([][]T, P)
	for r := range P {
		in[r] = data[T](P*n, r, int(op))
		out[r] = make([]T, n)
	}
	want := reference(op, in)
	mustAll(t, onAll(comms, func(r int, c *Comm) error {
		if inPlace {
			b := comm.Host(in[r])
			return c.ReduceScatter(t.Context(), b, b.Slice(r*n, (r+1)*n), op)
		}
		return c.ReduceScatter(t.Context(), comm.Host(in[r]), comm.Host(out[r]), op)
	}))
	for r := range P {
		got := out[r]
		if inPlace {
			got = in[r][r*n : (r+1)*n]
		}
		if w := want[r*n : (r+1)*n]; !slices.Equal(got, w) {
			i := firstDiff(got, w)
			t.Fatalf("%s in-place=%v: rank %d element %d = %v, want %v", op, inPlace, r, i, got[i], w[i])
		}
	}
}

func TestBarrier(t *testing.T) {
	for _, size := range sizes {
		t.Run(fmt.Sprintf("size=%d", size), func(t *testing.T) {
			comms := newMesh(t, size)
			var entered atomic.Int64
			for round := 1; round <= 5; round++ {
				mustAll(t, onAll(comms, func(r int, c *Comm) error {
					entered.Add(1)
					if err := c.Barrier(t.Context()); err != nil {
						return err
					}
					if got, want := entered.Load(), int64(round*size); got < want {
						return fmt.Errorf("left barrier %d after %d entries, want %d", round, got, want)
					}
					return nil
				}))
				// Hold everyone until all have checked, so the next round's
				// entries do not count for this one.
				mustAll(t, onAll(comms, func(int, *Comm) error { return nil }))
			}
			for r, c := range comms {
				if c.Seq() != 5 && size > 1 {
					t.Errorf("rank %d: Seq = %d, want 5", r, c.Seq())
				}
			}
		})
	}
}

func TestSizeOneNeedsNoNetwork(t *testing.T) {
	c, err := New(t.Context(), Config{Name: "solo", Rank: 0, Size: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	send := []int32{-3, 5}
	recv := make([]int32, 2)
	if err := c.AllReduce(t.Context(), comm.Host(send), comm.Host(recv), comm.Avg); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(recv, send) {
		t.Fatalf("recv = %v, want %v", recv, send)
	}
	if err := c.Barrier(t.Context()); err != nil {
		t.Fatal(err)
	}
	if c.Seq() != 2 {
		t.Fatalf("Seq = %d, want 2", c.Seq())
	}
}

func TestConfigErrors(t *testing.T) {
	store := commtest.NewMemStore()
	for _, tc := range []struct {
		cfg  Config
		want string
	}{
		{Config{Name: "x", Size: 0}, "size is 0"},
		{Config{Name: "x", Rank: 2, Size: 2, Host: "127.0.0.1", Store: store}, "rank 2 is out of range for 2 ranks"},
		{Config{Name: "x", Rank: -1, Size: 2, Host: "127.0.0.1", Store: store}, "rank -1 is out of range"},
		{Config{Rank: 0, Size: 1}, "needs a Name"},
		{Config{Name: "x", Generation: -1, Size: 1}, "generation is -1"},
		{Config{Name: "x", Size: 2, Store: store}, "Host is empty"},
		{Config{Name: "x", Size: 2, Host: "127.0.0.1"}, "Store is nil"},
	} {
		_, err := New(t.Context(), tc.cfg)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("New(%+v) = %v, want an error containing %q", tc.cfg, err, tc.want)
		}
	}
}

func TestArgumentErrors(t *testing.T) {
	comms := newMesh(t, 2)
	c := comms[0]
	ctx := t.Context()
	f4 := comm.Host(make([]float32, 4))
	f8 := comm.Host(make([]float32, 8))
	f3 := comm.Host(make([]float32, 3))
	i4 := comm.Host(make([]int32, 4))
	dev := comm.Device(0x1000, 4, comm.Float32)
	for _, tc := range []struct {
		name string
		err  error
		want string
	}{
		{"dtype", c.AllReduce(ctx, f4, i4, comm.Sum), "allreduce: send is float32 but recv is int32"},
		{"count", c.AllReduce(ctx, f4, f3, comm.Sum), "allreduce: send holds 4 elements but recv holds 3"},
		{"op", c.AllReduce(ctx, f4, f4, comm.Op(9)), "unknown op Op(9)"},
		{"device", c.AllReduce(ctx, dev, dev, comm.Sum), "the cpu backend works on host memory; use the nccl backend for device buffers"},
		{"device bcast", c.Broadcast(ctx, dev, 0), "use the nccl backend"},
		{"root", c.Broadcast(ctx, f4, 2), "broadcast: root 2 is out of range for 2 ranks"},
		{"negative root", c.Broadcast(ctx, f4, -1), "root -1 is out of range"},
		{"allgather count", c.AllGather(ctx, f4, f4), "allgather: recv holds 4 elements, want 8"},
		{"allgather dtype", c.AllGather(ctx, f4, comm.Host(make([]int64, 8))), "send is float32 but recv is int64"},
		{"reducescatter count", c.ReduceScatter(ctx, f4, f4, comm.Sum), "reducescatter: send holds 4 elements, want 8"},
		{"reducescatter op", c.ReduceScatter(ctx, f8, f4, comm.Op(-1)), "unknown op"},
	} {
		if tc.err == nil || !strings.Contains(tc.err.Error(), tc.want) {
			t.Errorf("%s: err = %v, want it to contain %q", tc.name, tc.err, tc.want)
		}
	}
	if c.Seq() != 0 {
		t.Errorf("Seq = %d after rejected calls, want 0", c.Seq())
	}
	// The communicator still works.
	mustAll(t, onAll(comms, func(_ int, c *Comm) error { return c.Barrier(ctx) }))
}

func TestMismatchNamesBothCollectives(t *testing.T) {
	comms := newMesh(t, 2)
	errs := onAll(comms, func(r int, c *Comm) error {
		b := comm.Host(make([]float32, 10+r))
		return c.AllReduce(t.Context(), b, b, comm.Sum)
	})
	// The rank that sees the mismatch first closes its connections, which can
	// reset the other's before it reads the header; so at least one rank
	// reports the mismatch and the other a failure.
	mismatched := -1
	for r, err := range errs {
		if err == nil {
			t.Fatalf("rank %d: no error", r)
		}
		if errors.Is(err, ErrMismatch) {
			mismatched = r
		}
	}
	if mismatched < 0 {
		t.Fatalf("no rank reported ErrMismatch: %v", errs)
	}
	err := errs[mismatched]
	for _, want := range []string{"allreduce #1 (float32 sum, 10 elements)", "allreduce #1 (float32 sum, 11 elements)"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("rank %d: err = %v, want it to contain %q", mismatched, err, want)
		}
	}
	c := comms[mismatched]
	err = c.Barrier(t.Context())
	if !errors.Is(err, ErrMismatch) || !strings.Contains(err.Error(), "broke earlier") {
		t.Errorf("next collective: err = %v, want it to report the earlier mismatch", err)
	}
}

func TestPeerCloseNamesThePeer(t *testing.T) {
	for _, tu := range []tuning{defaults, ring} {
		t.Run(tu.name, func(t *testing.T) {
			comms := newMesh(t, 3)
			tu.apply(comms)
			errs := onAll(comms, func(r int, c *Comm) error {
				if r == 2 {
					return c.Close()
				}
				b := comm.Host(make([]float32, 1<<18))
				return c.AllReduce(t.Context(), b, b, comm.Sum)
			})
			for r := range 2 {
				err := errs[r]
				if err == nil || !strings.Contains(err.Error(), "closed the connection during allreduce #1") ||
					!strings.Contains(err.Error(), "(127.0.0.1:") {
					t.Errorf("rank %d: err = %v, want a peer named as having closed the connection", r, err)
				}
			}
			// Rank 0 receives from rank 2 in the ring and in the direct exchange
			// reads rank 2 first... unless rank 1 failed first; at least one
			// rank must name rank 2.
			if !strings.Contains(errs[0].Error()+errs[1].Error(), "rank 2 (127.0.0.1:") {
				t.Errorf("no rank named rank 2: %v; %v", errs[0], errs[1])
			}
		})
	}
}

func TestPeerCloseTwoRanks(t *testing.T) {
	comms := newMesh(t, 2)
	errs := onAll(comms, func(r int, c *Comm) error {
		if r == 1 {
			return c.Close()
		}
		b := comm.Host(make([]float64, 1<<20))
		return c.AllReduce(t.Context(), b, b, comm.Max)
	})
	if err := errs[0]; err == nil || !strings.Contains(err.Error(), "cpucomm: rank 1 (127.0.0.1:") ||
		!strings.Contains(err.Error(), "closed the connection during allreduce #1") {
		t.Fatalf("err = %v, want rank 1 named", err)
	}
	if err := comms[1].Barrier(t.Context()); !errors.Is(err, comm.ErrClosed) {
		t.Fatalf("Barrier after Close = %v, want comm.ErrClosed", err)
	}
}

func TestContextCancelUnblocks(t *testing.T) {
	comms := newMesh(t, 2)
	// Rank 1 never joins: rank 0 blocks until its deadline. The deadline
	// must pass during the collective: one that passed before it began
	// (a loaded machine can take 50 ms to get there) fails it at once,
	// unnumbered, and the communicator stays usable; try a longer one.
	b := comm.Host(make([]float32, 1<<20))
	var err error
	for d := 50 * time.Millisecond; ; d *= 2 {
		ctx, cancel := context.WithTimeout(t.Context(), d)
		err = comms[0].AllReduce(ctx, b, b, comm.Sum)
		cancel()
		if err == nil || strings.Contains(err.Error(), "#") || d > 10*time.Second {
			break
		}
	}
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "allreduce #1") {
		t.Fatalf("err = %v, want DeadlineExceeded during allreduce #1", err)
	}
	// Rank 0 closed its connections, so rank 1 learns at once.
	err = comms[1].AllReduce(t.Context(), b, b, comm.Sum)
	if err == nil || !strings.Contains(err.Error(), "rank 0 (127.0.0.1:") {
		t.Fatalf("rank 1: err = %v, want rank 0 named", err)
	}
	// A context already done fails before any communication.
	done, cancel2 := context.WithCancel(t.Context())
	cancel2()
	if err := comms[0].Barrier(done); err == nil {
		t.Fatal("Barrier on a broken communicator succeeded")
	}
}

func TestContextCancelDirect(t *testing.T) {
	comms := newMesh(t, 3)
	ctx, cancel := context.WithCancel(t.Context())
	errc := make(chan error, 1)
	go func() { errc <- comms[1].Barrier(ctx) }()
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
}

func TestNewWaitsForMissingRanks(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	store := commtest.NewMemStore()
	_, err := New(ctx, Config{Name: "t", Rank: 0, Size: 3, Host: "127.0.0.1", Store: store})
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "wait for ranks [1 2] to connect") {
		t.Fatalf("rank 0: err = %v", err)
	}
	ctx, cancel = context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	_, err = New(ctx, Config{Name: "t", Rank: 1, Size: 2, Host: "127.0.0.1", Store: commtest.NewMemStore()})
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "get the address of rank 0") {
		t.Fatalf("rank 1: err = %v", err)
	}
}

func TestHandshakeRejectsStrangers(t *testing.T) {
	store := commtest.NewMemStore()
	type result struct {
		c   *Comm
		err error
	}
	rank0 := make(chan result, 1)
	go func() {
		c, err := New(t.Context(), Config{Name: "a", Generation: 4, Rank: 0, Size: 2, Host: "127.0.0.1", Store: store})
		rank0 <- result{c, err}
	}()
	addr, err := store.Get(t.Context(), AddrKey("a", 4, 0))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		stranger *Comm
		want     string
	}{
		{&Comm{name: "b", generation: 4, rank: 1, size: 2}, `the dialer says communicator name "b", but this is "a"`},
		{&Comm{name: "a", generation: 3, rank: 1, size: 2}, "generation 3, but this is generation 4"},
		{&Comm{name: "a", generation: 4, rank: 1, size: 3}, "size 3, but this communicator has 2 ranks"},
		{&Comm{name: "a", generation: 4, rank: 5, size: 2}, "accepts only ranks 1..1"},
	} {
		s := commtest.NewMemStore()
		s.Put(t.Context(), AddrKey(tc.stranger.name, tc.stranger.generation, 0), addr)
		_, err := tc.stranger.dial(t.Context(), s, "127.0.0.1:1", 0)
		if err == nil || !strings.Contains(err.Error(), "rejected") || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: err = %v, want a rejection containing %q", tc.stranger, err, tc.want)
		}
	}
	// The real rank 1 still gets in.
	c1, err := New(t.Context(), Config{Name: "a", Generation: 4, Rank: 1, Size: 2, Host: "127.0.0.1", Store: store})
	if err != nil {
		t.Fatal(err)
	}
	defer c1.Close()
	r0 := <-rank0
	if r0.err != nil {
		t.Fatal(r0.err)
	}
	defer r0.c.Close()
	comms := []*Comm{r0.c, c1}
	mustAll(t, onAll(comms, func(_ int, c *Comm) error { return c.Barrier(t.Context()) }))
}

func TestDialerChecksAcceptorRank(t *testing.T) {
	// A store that points rank 1 at rank 0's address while it looks for rank 0
	// is fine; pointing it at an address where another rank listens is not.
	store := commtest.NewMemStore()
	ready := make(chan error, 1)
	go func() {
		_, err := New(t.Context(), Config{Name: "a", Rank: 1, Size: 3, Host: "127.0.0.1", Store: store})
		ready <- err
	}()
	addr, err := store.Get(t.Context(), AddrKey("a", 0, 1))
	if err != nil {
		t.Fatal(err)
	}
	// Rank 2 of the same communicator, told that rank 1's address is rank 0's.
	s := commtest.NewMemStore()
	s.Put(t.Context(), AddrKey("a", 0, 0), addr)
	stranger := &Comm{name: "a", rank: 2, size: 3}
	_, err = stranger.dial(t.Context(), s, "127.0.0.1:1", 0)
	if err == nil || !strings.Contains(err.Error(), "the listener there is rank 1, not 0") {
		t.Fatalf("err = %v", err)
	}
}
