// Package benchrun is the worker side and the report of `gotrain bench`:
// collective benchmarks in the manner of nccl-tests, one process per GPU (or
// per CPU rank) started through the normal launch path.
//
// Each worker builds the job's communicator, fills its send buffer with a
// pattern of its rank, and for every size runs Warmup collectives, then Iters
// back to back, timed with CUDA events on the communicator's stream (the CPU
// backend: the wall clock), out of place. It then copies the result back and
// counts the elements that differ from what the collective must produce
// (#wrong). The ranks' times are averaged and their #wrong summed, as
// nccl-tests does, and rank 0 writes the Report.
//
// Sizes, counts and bandwidths follow nccl-tests: size is the larger of the
// send and receive buffers (the whole gathered buffer for all_gather, the
// whole input for reduce_scatter), algbw = size / time, and busbw = algbw ×
// 2(n-1)/n for allreduce, × (n-1)/n for all_gather and reduce_scatter, × 1
// for broadcast.
package benchrun

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/gotrain/gotrain/worker/comm"
)

// The collectives `gotrain bench` measures.
const (
	AllReduce     = "allreduce"
	AllGather     = "all_gather"
	ReduceScatter = "reduce_scatter"
	Broadcast     = "broadcast"
)

// Ops lists the collectives in the order `gotrain bench --help` shows them.
var Ops = []string{AllReduce, AllGather, ReduceScatter, Broadcast}

// Spec is one benchmark run: what every worker measures.
type Spec struct {
	Op     string `json:"op"`
	Min    int64  `json:"min_bytes"`
	Max    int64  `json:"max_bytes"`
	Factor int64  `json:"factor"`
	DType  string `json:"dtype"`
	RedOp  string `json:"redop"`
	Root   int    `json:"root"`
	Iters  int    `json:"iters"`
	Warmup int    `json:"warmup"`
}

// DefaultSpec returns the defaults of `gotrain bench`: 8 B to 4 GiB by ×4,
// float32 sum, 20 timed iterations after 5 warm-up ones.
func DefaultSpec(op string) Spec {
	return Spec{Op: op, Min: 8, Max: 4 << 30, Factor: 4, DType: "float32", RedOp: "sum", Iters: 20, Warmup: 5}
}

// DefaultCPUSpec returns the defaults of `gotrain bench --backend cpu`: 8 B
// to 32 MiB by ×4, 10 timed iterations after 2 warm-up ones. The CPU
// backend moves about a GB/s between processes (TCP over loopback), so this
// finishes in seconds, and each rank holds a few buffers of the largest size
// (about 150 MB) instead of 4 GiB ones.
func DefaultCPUSpec(op string) Spec {
	s := DefaultSpec(op)
	s.Max, s.Iters, s.Warmup = 32<<20, 10, 2
	return s
}

// Validate checks s for ranks ranks.
func (s *Spec) Validate(ranks int) error {
	known := false
	for _, o := range Ops {
		known = known || o == s.Op
	}
	if !known {
		return fmt.Errorf("unknown collective %q (want one of %s)", s.Op, strings.Join(Ops, ", "))
	}
	dt, err := comm.ParseDType(s.DType)
	if err != nil {
		return err
	}
	if _, err := comm.ParseOp(s.RedOp); err != nil {
		return err
	}
	switch {
	case s.Min < int64(dt.Size()):
		return fmt.Errorf("--min is %d bytes, less than one %s element", s.Min, s.DType)
	case s.Max < s.Min:
		return fmt.Errorf("--max (%d) is below --min (%d)", s.Max, s.Min)
	case s.Factor < 2:
		return fmt.Errorf("--factor is %d, want at least 2", s.Factor)
	case s.Iters < 1:
		return fmt.Errorf("--iters is %d, want at least 1", s.Iters)
	case s.Warmup < 0:
		return fmt.Errorf("--warmup is %d, want 0 or more", s.Warmup)
	case ranks < 1:
		return fmt.Errorf("%d ranks, want at least 1", ranks)
	case s.Op == Broadcast && (s.Root < 0 || s.Root >= ranks):
		return fmt.Errorf("--root %d is out of range for %d ranks", s.Root, ranks)
	}
	return nil
}

func (s *Spec) dtype() comm.DType { d, _ := comm.ParseDType(s.DType); return d }
func (s *Spec) redOp() comm.Op    { o, _ := comm.ParseOp(s.RedOp); return o }

// reduces reports whether the collective applies RedOp.
func (s *Spec) reduces() bool { return s.Op == AllReduce || s.Op == ReduceScatter }

// Shape is one size of a run, in elements.
type Shape struct {
	Bytes     int64 // nccl-tests' size: Count elements
	Count     int64 // elements of the larger buffer
	SendCount int64
	RecvCount int64
}

// Shapes returns the sizes from Min to Max (by Factor) for ranks ranks. A
// size is rounded down to whole elements, and for all_gather and
// reduce_scatter to a multiple of ranks (at least one element per rank), as
// nccl-tests does.
func (s *Spec) Shapes(ranks int) []Shape {
	esz := int64(s.dtype().Size())
	n := int64(ranks)
	var out []Shape
	for size := s.Min; size <= s.Max; size *= s.Factor {
		count := size / esz
		sh := Shape{Count: count, SendCount: count, RecvCount: count}
		switch s.Op {
		case AllGather:
			sh.Count = max(count/n, 1) * n
			sh.SendCount, sh.RecvCount = sh.Count/n, sh.Count
		case ReduceScatter:
			sh.Count = max(count/n, 1) * n
			sh.SendCount, sh.RecvCount = sh.Count, sh.Count/n
		}
		sh.Bytes = sh.Count * esz
		out = append(out, sh)
		if size > (1<<62)/s.Factor {
			break
		}
	}
	return out
}

// BusFactor is busbw / algbw for the collective on ranks ranks.
func BusFactor(op string, ranks int) float64 {
	n := float64(ranks)
	switch op {
	case AllReduce:
		return 2 * (n - 1) / n
	case AllGather, ReduceScatter:
		return (n - 1) / n
	}
	return 1
}

// ParseSize parses a byte count with an optional binary suffix: "8", "64K",
// "4M", "4G" (K, M, G, T are powers of 1024; a trailing "B" or "iB" is allowed).
func ParseSize(v string) (int64, error) {
	s := strings.ToUpper(strings.TrimSpace(v))
	s = strings.TrimSuffix(strings.TrimSuffix(s, "B"), "I")
	mult := int64(1)
	if s != "" {
		switch s[len(s)-1] {
		case 'K':
			mult = 1 << 10
		case 'M':
			mult = 1 << 20
		case 'G':
			mult = 1 << 30
		case 'T':
			mult = 1 << 40
		}
		if mult > 1 {
			s = s[:len(s)-1]
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("size %q: want a byte count such as 8, 64K, 4M or 4G", v)
	}
	if n > (1<<62)/mult {
		return 0, errors.New("size " + v + " is too large")
	}
	return n * mult, nil
}

// FormatSize writes a byte count as nccl-tests' tables do not, but people
// read: 8, 32K, 2M, 1G when exact, else the plain number.
func FormatSize(n int64) string {
	for _, u := range []struct {
		shift int
		s     string
	}{{40, "T"}, {30, "G"}, {20, "M"}, {10, "K"}} {
		if n >= 1<<u.shift && n%(1<<u.shift) == 0 {
			return strconv.FormatInt(n>>u.shift, 10) + u.s
		}
	}
	return strconv.FormatInt(n, 10)
}
