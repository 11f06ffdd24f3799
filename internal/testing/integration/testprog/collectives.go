package main

import (
	"context"
	"flag"
	"fmt"
	"time"

	"github.com/gotrain/gotrain/worker"
	"github.com/gotrain/gotrain/worker/comm"
)

// collectives runs every collective for every dtype and op over a range of
// sizes and checks each result element by element against values computed
// here. Inputs are small integers, so float sums are exact whatever order a
// backend adds them in, and the expected values are exact too.
func collectives(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("collectives", flag.ExitOnError)
	maxCount := fs.Int("max", 16<<20, "largest all-reduce, in elements")
	_ = fs.Parse(args)
	w, err := worker.Init(ctx)
	if err != nil {
		return err
	}
	defer w.Close()
	c, err := w.NewComm(ctx, "test")
	if err != nil {
		return err
	}
	defer c.Close()

	var counts []int
	for _, n := range []int{1, 2, 3, 7, 1000, 4097, 65537, 1 << 20, 16 << 20} {
		if n <= *maxCount {
			counts = append(counts, n)
		}
	}
	start := time.Now()
	checked := 0
	for _, n := range counts {
		for _, dt := range []comm.DType{comm.Float32, comm.Float64, comm.Int32, comm.Int64} {
			for _, op := range []comm.Op{comm.Sum, comm.Avg, comm.Max, comm.Min} {
				var err error
				switch dt {
				case comm.Float32:
					err = checkAllReduce[float32](ctx, c, n, op)
				case comm.Float64:
					err = checkAllReduce[float64](ctx, c, n, op)
				case comm.Int32:
					err = checkAllReduce[int32](ctx, c, n, op)
				case comm.Int64:
					err = checkAllReduce[int64](ctx, c, n, op)
				}
				if err != nil {
					return fmt.Errorf("rank %d: allreduce %s %s count %d: %w", w.Rank, dt, op, n, err)
				}
				checked++
			}
		}
	}
	for _, n := range []int{1, 1000, 65537} {
		if err := checkOthers(ctx, c, n); err != nil {
			return fmt.Errorf("rank %d: count %d: %w", w.Rank, n, err)
		}
	}
	if err := c.Barrier(ctx); err != nil {
		return err
	}
	fmt.Printf("collectives ok: %d all-reduces up to %d elements, world %d, %.1fs\n", checked, counts[len(counts)-1], c.Size(), time.Since(start).Seconds())
	return nil
}

// value is rank r's input at index i: a small signed integer.
func value(r, i int) int64 { return int64((i*7+r*13)%97) - 48 }

func checkAllReduce[T comm.Element](ctx context.Context, c comm.Comm, n int, op comm.Op) error {
	buf := make([]T, n)
	for i := range buf {
		buf[i] = T(value(c.Rank(), i))
	}
	if err := c.AllReduce(ctx, comm.Host(buf), comm.Host(buf), op); err != nil {
		return err
	}
	// value(r, i) depends on i only through i mod 97, so 97 expected values
	// cover any count.
	var want [97]T
	for k := range want {
		w := T(value(0, k))
		for r := 1; r < c.Size(); r++ {
			v := T(value(r, k))
			switch op {
			case comm.Sum, comm.Avg:
				w += v
			case comm.Max:
				w = max(w, v)
			case comm.Min:
				w = min(w, v)
			}
		}
		if op == comm.Avg {
			w /= T(c.Size())
		}
		want[k] = w
	}
	for i, got := range buf {
		if got != want[i%97] {
			return fmt.Errorf("element %d = %v, want %v", i, got, want[i%97])
		}
	}
	return nil
}

// checkOthers checks Broadcast, AllGather and ReduceScatter on float64.
func checkOthers(ctx context.Context, c comm.Comm, n int) error {
	size, rank := c.Size(), c.Rank()
	root := size - 1
	b := make([]float64, n)
	for i := range b {
		b[i] = float64(value(rank, i))
	}
	if err := c.Broadcast(ctx, comm.Host(b), root); err != nil {
		return err
	}
	for i, v := range b {
		if v != float64(value(root, i)) {
			return fmt.Errorf("broadcast: element %d = %v, want %v", i, v, value(root, i))
		}
	}
	send := make([]float64, n)
	for i := range send {
		send[i] = float64(value(rank, i))
	}
	all := make([]float64, n*size)
	if err := c.AllGather(ctx, comm.Host(send), comm.Host(all)); err != nil {
		return err
	}
	for r := range size {
		for i := range n {
			if all[r*n+i] != float64(value(r, i)) {
				return fmt.Errorf("allgather: block %d element %d = %v, want %v", r, i, all[r*n+i], value(r, i))
			}
		}
	}
	rsSend := make([]float64, n*size)
	for i := range rsSend {
		rsSend[i] = float64(value(rank, i))
	}
	rsRecv := make([]float64, n)
	if err := c.ReduceScatter(ctx, comm.Host(rsSend), comm.Host(rsRecv), comm.Sum); err != nil {
		return err
	}
	for i, got := range rsRecv {
		var want float64
		for r := range size {
			want += float64(value(r, rank*n+i))
		}
		if got != want {
			return fmt.Errorf("reducescatter: element %d = %v, want %v", i, got, want)
		}
	}
	return nil
}
