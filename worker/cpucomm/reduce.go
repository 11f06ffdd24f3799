package cpucomm

import (
	"unsafe"

	"github.com/gotrain/gotrain/worker/comm"
)

// number is the set of element types the reductions work on.
type number interface {
	~float32 | ~float64 | ~int32 | ~int64
}

// view returns b as a slice of T. b must start at a T-aligned address: it is a
// region of a user buffer at an element offset, or of an alignedBytes scratch.
func view[T number](b []byte) []T {
	if len(b) == 0 {
		return nil
	}
	var zero T
	return unsafe.Slice((*T)(unsafe.Pointer(unsafe.SliceData(b))), len(b)/int(unsafe.Sizeof(zero)))
}

// alignedBytes returns n bytes of zeroed memory aligned for every dtype.
func alignedBytes(n int) []byte {
	if n == 0 {
		return nil
	}
	words := make([]uint64, (n+7)/8)
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(words))), n)
}

// reduceBytes sets dst = a op b, element by element, for dtype dt. dst may be
// a or b. Avg reduces like Sum; divideBytes finishes it.
func reduceBytes(dt comm.DType, op comm.Op, dst, a, b []byte) {
	switch dt {
	case comm.Float32:
		reduce(op, view[float32](dst), view[float32](a), view[float32](b))
	case comm.Float64:
		reduce(op, view[float64](dst), view[float64](a), view[float64](b))
	case comm.Int32:
		reduce(op, view[int32](dst), view[int32](a), view[int32](b))
	case comm.Int64:
		reduce(op, view[int64](dst), view[int64](a), view[int64](b))
	}
}

func reduce[T number](op comm.Op, dst, a, b []T) {
	n := len(dst)
	a, b = a[:n], b[:n]
	switch op {
	case comm.Sum, comm.Avg:
		for i := range dst {
			dst[i] = a[i] + b[i]
		}
	case comm.Max:
		for i := range dst {
			x, y := a[i], b[i]
			if y > x {
				x = y
			}
			dst[i] = x
		}
	case comm.Min:
		for i := range dst {
			x, y := a[i], b[i]
			if y < x {
				x = y
			}
			dst[i] = x
		}
	}
}

// divideBytes divides every element of b by n; integers truncate toward zero.
func divideBytes(dt comm.DType, b []byte, n int) {
	switch dt {
	case comm.Float32:
		divide(view[float32](b), float32(n))
	case comm.Float64:
		divide(view[float64](b), float64(n))
	case comm.Int32:
		divide(view[int32](b), int32(n))
	case comm.Int64:
		divide(view[int64](b), int64(n))
	}
}

func divide[T number](b []T, n T) {
	for i := range b {
		b[i] /= n
	}
}
