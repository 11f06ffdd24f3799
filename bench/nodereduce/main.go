// Command nodereduce times the copy-engine all-reduce of package
// worker/nodereduce (and pairreduce's at two ranks) against NCCL's
// all-reduce, side by side on the same ranks and buffers, and checks both:
// the copy-engine result must equal the rank-order float32 sum × 1/N
// bitwise on every rank, NCCL's within 1e-5 relative. It runs as the
// workers of gotrain launch (--backend nccl); rank 0 prints a table:
//
//	gotrain launch --nproc-per-node 4 --ranks-per-gpu 4 --backend nccl -- nodereduce --max 64M
//
// The time of one all-reduce is the mean over ranks of (the time of
// --iters back-to-back all-reduces after --warmup) / --iters, timed with
// CUDA events. Exits 1 when a result is wrong.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"hash/fnv"
	"math"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/gotrain/gotrain/gpu/cudadrv"
	"github.com/gotrain/gotrain/nccl"
	"github.com/gotrain/gotrain/worker"
	"github.com/gotrain/gotrain/worker/comm"
	"github.com/gotrain/gotrain/worker/ncclcomm"
	"github.com/gotrain/gotrain/worker/nodereduce"
	"github.com/gotrain/gotrain/worker/pairreduce"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "nodereduce:", err)
		os.Exit(1)
	}
}

type opts struct {
	min, max     int64
	iters, ncclN int
	warmup       int
	buckets      int
}

func run(ctx context.Context) error {
	var o opts
	minS := flag.String("min", "4K", "smallest size in bytes (K, M suffixes)")
	maxS := flag.String("max", "64M", "largest size in bytes; sizes go up by 4x")
	flag.IntVar(&o.iters, "iters", 20, "timed copy-engine all-reduces per size")
	flag.IntVar(&o.ncclN, "nccl-iters", 10, "timed NCCL all-reduces per size (each costs tens of ms when ranks share a GPU)")
	flag.IntVar(&o.warmup, "warmup", 3, "untimed all-reduces before each timing")
	flag.IntVar(&o.buckets, "buckets", 1, "buckets the buffer is reduced in (DataParallel's)")
	flag.Parse()
	var err error
	if o.min, err = parseSize(*minS); err != nil {
		return err
	}
	if o.max, err = parseSize(*maxS); err != nil {
		return err
	}
	w, err := worker.Init(ctx)
	if err != nil {
		return err
	}
	defer w.Close()
	wrong := false
	err = w.Run(ctx, "nodereduce-bench", func(ctx context.Context, g *worker.Generation) error {
		nc, ok := unwrap(g.Comm).(*ncclcomm.Comm)
		if !ok {
			return errors.New("needs --backend nccl")
		}
		if g.Rank == 0 {
			name := ""
			_ = nc.Do(func() error {
				d, err := cudadrv.CurrentDevice()
				if err == nil {
					name, _ = d.Name()
				}
				return nil
			})
			fmt.Printf("# nodereduce bench: %d ranks, %s, buckets %d, copy-engine %d iters, NCCL %d iters\n", g.WorldSize, name, o.buckets, o.iters, o.ncclN)
			fmt.Printf("| ranks | bytes | NCCL µs | copy-engine µs | NCCL ÷ copy-engine | pairreduce µs | wrong (NCCL/CE/pair) | ranks agree (CE) |\n|---:|---:|---:|---:|---:|---:|---|---|\n")
		}
		for sz := o.min; sz <= o.max; sz *= 4 {
			r, err := measure(ctx, g, nc, o, int(sz/4))
			if err != nil {
				return fmt.Errorf("rank %d, %d bytes: %w", g.Rank, sz, err)
			}
			if r.wrong[0]+r.wrong[1]+r.wrong[2] > 0 || !r.agree {
				wrong = true
			}
			if g.Rank == 0 {
				pair := "-"
				if r.pairUS > 0 {
					pair = fmt.Sprintf("%.1f", r.pairUS)
				}
				fmt.Printf("| %d | %d | %.1f | %.1f | %.1f | %s | %d/%d/%d | %t |\n", g.WorldSize, sz, r.ncclUS, r.ceUS, r.ncclUS/r.ceUS, pair, r.wrong[0], r.wrong[1], r.wrong[2], r.agree)
			}
		}
		return nil
	})
	if err == nil && wrong {
		err = errors.New("some results were wrong")
	}
	return err
}

func unwrap(c worker.Comm) worker.Comm {
	for {
		u, ok := c.(comm.Unwrapper)
		if !ok {
			return c
		}
		c = u.Unwrap()
	}
}

type result struct {
	ncclUS, ceUS, pairUS float64
	wrong                [3]int64 // NCCL, copy engine, pair
	agree                bool
}

// value is rank r's element i: fractions of both signs, so that sums round.
func value(r, i int) float32 {
	return float32(math.Sin(float64(i)*0.37+float64(r)*1.1)) * float32(1+r)
}

func refSum(ranks, i int, scale float32) float32 {
	acc := value(0, i)
	for r := 1; r < ranks; r++ {
		acc += value(r, i)
	}
	return acc * scale
}

type side struct {
	g        cudadrv.DevicePtr
	cp, sum  cudadrv.Stream
	start    cudadrv.Event
	end      cudadrv.Event
	sent     cudadrv.Event
	joined   cudadrv.Event // the sum stream's end of an all-reduce, which the next one's copies wait for
	fill     []float32
	n, ranks int
}

func measure(ctx context.Context, g *worker.Generation, nc *ncclcomm.Comm, o opts, n int) (result, error) {
	var res result
	s := &side{n: n, ranks: g.WorldSize, fill: make([]float32, n)}
	for i := range s.fill {
		s.fill[i] = value(g.Rank, i)
	}
	if err := nc.Do(s.create); err != nil {
		return res, err
	}
	defer nc.Do(s.destroy)
	m := &measurement{ctx: ctx, g: g, nc: nc, o: o, s: s, res: &res,
		scale: float32(1 / float64(g.WorldSize)), spans: bucketSpans(n, o.buckets)}
	if err := m.nccl(); err != nil {
		return res, err
	}
	if err := m.copyEngines(); err != nil {
		return res, err
	}
	if g.WorldSize != 2 {
		return res, nil
	}
	err := m.pair()
	return res, err
}

// create allocates the side's gradients, streams and events (on the
// communicator's thread).
func (s *side) create() error {
	n := s.n
	var err error
	if s.g, err = cudadrv.MemAlloc(4 * n); err != nil {
		return err
	}
	for _, st := range []*cudadrv.Stream{&s.cp, &s.sum} {
		if *st, err = cudadrv.NewStream(cudadrv.StreamNonBlocking); err != nil {
			return err
		}
	}
	for _, ev := range []*cudadrv.Event{&s.start, &s.end} {
		if *ev, err = cudadrv.NewEvent(0); err != nil {
			return err
		}
	}
	if s.sent, err = cudadrv.NewEvent(cudadrv.EventDisableTiming); err != nil {
		return err
	}
	s.joined, err = cudadrv.NewEvent(cudadrv.EventDisableTiming)
	return err
}

// destroy waits for the side's streams and frees what create made.
func (s *side) destroy() error {
	_ = s.cp.Synchronize()
	_ = s.sum.Synchronize()
	_ = s.cp.Destroy()
	_ = s.sum.Destroy()
	_ = s.start.Destroy()
	_ = s.end.Destroy()
	_ = s.sent.Destroy()
	_ = s.joined.Destroy()
	return s.g.Free()
}

// measurement is one size's runs of the three all-reduces.
type measurement struct {
	ctx   context.Context
	g     *worker.Generation
	nc    *ncclcomm.Comm
	o     opts
	s     *side
	res   *result
	scale float32
	spans []nodereduce.Span
}

// nccl checks and times NCCL's all-reduce.
func (m *measurement) nccl() error {
	ctx, g, nc, o, s, n, res := m.ctx, m.g, m.nc, m.o, m.s, m.s.n, m.res
	st := cudadrv.Stream(nc.Stream())
	ncclOnce := func() error {
		return nc.NCCL().AllReduce(uintptr(s.g), uintptr(s.g), n, nccl.Float32, nccl.Avg, uintptr(st))
	}
	var err error
	if res.wrong[0], _, err = s.check(nc, st, ncclOnce, g.Rank, 1e-5); err != nil {
		return fmt.Errorf("NCCL: %w", err)
	}
	us, err := s.time(nc, st, st, o.warmup, o.ncclN, ncclOnce)
	if err != nil {
		return fmt.Errorf("NCCL: %w", err)
	}
	res.ncclUS = mean(ctx, g, us)
	return nil
}

// copyEngines checks and times nodereduce, the copy engines over N ranks.
func (m *measurement) copyEngines() error {
	ctx, g, nc, o, s, res, scale, spans := m.ctx, m.g, m.nc, m.o, m.s, m.res, m.scale, m.spans
	node, err := nodereduce.Open(ctx, nc, nc.Do, nodereduce.Config{Grads: uintptr(s.g), Buckets: spans})
	if err != nil {
		return err
	}
	ceOnce := func() error {
		for b := range spans {
			if err := node.Send(b, uintptr(s.cp)); err != nil {
				return err
			}
			if err := node.Reduce(b, scale, uintptr(s.sum)); err != nil {
				return err
			}
		}
		node.Next()
		return s.join()
	}
	var sum uint64
	if res.wrong[1], sum, err = s.check(nc, s.sum, ceOnce, g.Rank, 0); err != nil {
		return fmt.Errorf("copy engine: %w", err)
	}
	if res.agree, err = agree(ctx, g, sum); err != nil {
		return err
	}
	us, err := s.time(nc, s.cp, s.sum, o.warmup, o.iters, ceOnce)
	if err != nil {
		return fmt.Errorf("copy engine: %w", err)
	}
	res.ceUS = mean(ctx, g, us)
	return closeAll(ctx, nc, s, node.Close)
}

// pair checks and times pairreduce, the two-rank transport.
func (m *measurement) pair() error {
	ctx, g, nc, o, s, n, res, scale, spans := m.ctx, m.g, m.nc, m.o, m.s, m.s.n, m.res, m.scale, m.spans
	p, err := pairreduce.Open(ctx, nc, nc.Do, pairreduce.Config{Elements: n, Buckets: len(spans)})
	if err != nil {
		return err
	}
	pairOnce := func() error {
		for b, sp := range spans {
			if err := p.Send(b, sp.Offset, sp.Len, uintptr(s.g), uintptr(s.cp)); err != nil {
				return err
			}
			if err := s.sent.Record(s.cp); err != nil {
				return err
			}
			if err := s.sum.WaitEvent(s.sent); err != nil {
				return err
			}
			if err := p.Sum(b, sp.Offset, sp.Len, uintptr(s.g), scale, uintptr(s.sum)); err != nil {
				return err
			}
		}
		p.Next()
		return s.join()
	}
	if res.wrong[2], _, err = s.check(nc, s.sum, pairOnce, g.Rank, 0); err != nil {
		return fmt.Errorf("pair: %w", err)
	}
	us, err := s.time(nc, s.cp, s.sum, o.warmup, o.iters, pairOnce)
	if err != nil {
		return fmt.Errorf("pair: %w", err)
	}
	res.pairUS = mean(ctx, g, us)
	return closeAll(ctx, nc, s, p.Close)
}

// closeAll waits for this rank's streams, then for every rank (no rank
// may free memory another still writes into), then runs closeFn.
func closeAll(ctx context.Context, nc *ncclcomm.Comm, s *side, closeFn func() error) error {
	if err := nc.Do(func() error {
		if err := s.cp.Synchronize(); err != nil {
			return err
		}
		return s.sum.Synchronize()
	}); err != nil {
		return err
	}
	if err := nc.Barrier(ctx); err != nil {
		return err
	}
	return nc.Do(closeFn)
}

// join makes the next all-reduce's copies, which read the gradients, wait
// for this one's last writes to them (DataParallel orders them through the
// compute stream).
func (s *side) join() error {
	if err := s.joined.Record(s.sum); err != nil {
		return err
	}
	return s.cp.WaitEvent(s.joined)
}

func bucketSpans(n, buckets int) []nodereduce.Span {
	buckets = max(1, min(buckets, n))
	out := make([]nodereduce.Span, 0, buckets)
	for b := range buckets {
		lo, hi := b*n/buckets, (b+1)*n/buckets
		out = append(out, nodereduce.Span{Offset: lo, Len: hi - lo})
	}
	return out
}

// check fills the buffer, runs once (enqueueing on the given stream's
// context; done is the stream that ends it) and counts the elements off the
// rank-order reference by more than tol relative (0: bitwise). It returns a
// hash of the result for the ranks to compare.
func (s *side) check(nc *ncclcomm.Comm, done cudadrv.Stream, once func() error, rank int, tol float64) (int64, uint64, error) {
	got := make([]float32, s.n)
	err := nc.Do(func() error {
		if err := cudadrv.CopyToDevice(s.g, s.fill); err != nil {
			return err
		}
		if err := once(); err != nil {
			return err
		}
		for _, st := range []cudadrv.Stream{s.cp, s.sum, cudadrv.Stream(nc.Stream()), done} {
			if err := st.Synchronize(); err != nil {
				return err
			}
		}
		return cudadrv.CopyFromDevice(got, s.g)
	})
	if err != nil {
		return 0, 0, err
	}
	scale := float32(1 / float64(s.ranks))
	var bad int64
	h := fnv.New64a()
	var b [4]byte
	for i, v := range got {
		w := refSum(s.ranks, i, scale)
		u := math.Float32bits(v)
		b[0], b[1], b[2], b[3] = byte(u), byte(u>>8), byte(u>>16), byte(u>>24)
		h.Write(b[:])
		if tol == 0 {
			if u != math.Float32bits(w) {
				bad++
			}
		} else if math.Abs(float64(v-w)) > tol*math.Max(1, math.Abs(float64(w))) {
			bad++
		}
	}
	return bad, h.Sum64(), nil
}

// time runs warmup then iters all-reduces and returns the µs of one: from
// an event on first to one on last (which waits for first's work too).
func (s *side) time(nc *ncclcomm.Comm, first, last cudadrv.Stream, warmup, iters int, once func() error) (float64, error) {
	var us float64
	err := nc.Do(func() error {
		for range warmup {
			if err := once(); err != nil {
				return err
			}
		}
		for _, st := range []cudadrv.Stream{s.cp, s.sum, cudadrv.Stream(nc.Stream())} {
			if err := st.Synchronize(); err != nil {
				return err
			}
		}
		if err := s.start.Record(first); err != nil {
			return err
		}
		for range iters {
			if err := once(); err != nil {
				return err
			}
		}
		if first != last {
			if err := s.sent.Record(first); err != nil {
				return err
			}
			if err := last.WaitEvent(s.sent); err != nil {
				return err
			}
		}
		if err := s.end.Record(last); err != nil {
			return err
		}
		if err := s.end.Synchronize(); err != nil {
			return err
		}
		d, err := cudadrv.Elapsed(s.start, s.end)
		us = float64(d) / float64(time.Microsecond) / float64(iters)
		return err
	})
	return us, err
}

func mean(ctx context.Context, g *worker.Generation, us float64) float64 {
	v := []float64{us}
	if err := g.Comm.AllReduce(ctx, comm.Host(v), comm.Host(v), comm.Sum); err != nil {
		return math.NaN()
	}
	return v[0] / float64(g.WorldSize)
}

// agree reports whether every rank's result hashed the same.
func agree(ctx context.Context, g *worker.Generation, sum uint64) (bool, error) {
	lo, hi := int64(sum&0xffffffff), int64(sum>>32)
	v := []int64{lo, hi, -lo, -hi}
	if err := g.Comm.AllReduce(ctx, comm.Host(v), comm.Host(v), comm.Max); err != nil {
		return false, err
	}
	return v[0] == lo && v[1] == hi && -v[2] == lo && -v[3] == hi, nil
}

func parseSize(v string) (int64, error) {
	mult := int64(1)
	switch {
	case len(v) > 1 && (v[len(v)-1] == 'K' || v[len(v)-1] == 'k'):
		mult, v = 1<<10, v[:len(v)-1]
	case len(v) > 1 && (v[len(v)-1] == 'M' || v[len(v)-1] == 'm'):
		mult, v = 1<<20, v[:len(v)-1]
	}
	var n int64
	if _, err := fmt.Sscan(v, &n); err != nil || n <= 0 {
		return 0, fmt.Errorf("size %q: want a positive number of bytes, K or M", v)
	}
	return n * mult, nil
}
