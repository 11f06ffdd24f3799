// Package comm defines what every gotrain data-plane backend implements: the
// Comm interface with its collectives, the element types and reduction ops, and
// the Buffer that names the memory a collective works on. Package worker
// re-exports these names; backends (the pure-Go CPU backend, NCCL) import this
// package so that worker can import them without a cycle.
package comm

import (
	"context"
	"errors"
	"fmt"
	"unsafe"
)

// DType is the element type of a buffer.
type DType int

const (
	Float32 DType = iota
	Float64
	Int32
	Int64
)

var dtypeNames = [...]string{Float32: "float32", Float64: "float64", Int32: "int32", Int64: "int64"}

func (d DType) String() string {
	if d >= 0 && int(d) < len(dtypeNames) {
		return dtypeNames[d]
	}
	return fmt.Sprintf("DType(%d)", int(d))
}

// Size returns the size of one element in bytes.
func (d DType) Size() int {
	switch d {
	case Float32, Int32:
		return 4
	case Float64, Int64:
		return 8
	}
	return 0
}

// ParseDType parses a name as String returns it.
func ParseDType(s string) (DType, error) {
	for i, n := range dtypeNames {
		if n == s {
			return DType(i), nil
		}
	}
	return 0, fmt.Errorf("comm: unknown dtype %q (want float32, float64, int32 or int64)", s)
}

// Op is a reduction.
type Op int

const (
	Sum Op = iota
	Avg    // the sum divided by the number of ranks; integer types truncate toward zero
	Max
	Min
)

var opNames = [...]string{Sum: "sum", Avg: "avg", Max: "max", Min: "min"}

func (o Op) String() string {
	if o >= 0 && int(o) < len(opNames) {
		return opNames[o]
	}
	return fmt.Sprintf("Op(%d)", int(o))
}

// ParseOp parses a name as String returns it.
func ParseOp(s string) (Op, error) {
	for i, n := range opNames {
		if n == s {
			return Op(i), nil
		}
	}
	return 0, fmt.Errorf("comm: unknown op %q (want sum, avg, max or min)", s)
}

// Element is the set of Go types a host buffer may hold.
type Element interface {
	~float32 | ~float64 | ~int32 | ~int64
}

// Buffer names count elements of one dtype in host or device memory. The zero
// Buffer is empty. Buffers do not own memory: the caller keeps it alive and
// unchanged until the collective returns.
type Buffer struct {
	ptr    unsafe.Pointer // host memory
	dev    uintptr        // device memory (a CUdeviceptr), never dereferenced by Go
	count  int
	dtype  DType
	device bool
}

// Host returns a Buffer over a Go slice.
func Host[T Element](s []T) Buffer {
	var zero T
	var dt DType
	switch any(zero).(type) {
	case float32:
		dt = Float32
	case float64:
		dt = Float64
	case int32:
		dt = Int32
	case int64:
		dt = Int64
	default:
		// A named type (~float32 etc.): pick by size and kind via conversion.
		dt = dtypeOfNamed[T]()
	}
	if len(s) == 0 {
		return Buffer{dtype: dt}
	}
	return Buffer{ptr: unsafe.Pointer(unsafe.SliceData(s)), count: len(s), dtype: dt}
}

func dtypeOfNamed[T Element]() DType {
	var one T = 1
	isFloat := one/2 != 0 // 0.5 for floats, 0 for integers
	switch {
	case isFloat && unsafe.Sizeof(one) == 4:
		return Float32
	case isFloat:
		return Float64
	case unsafe.Sizeof(one) == 4:
		return Int32
	default:
		return Int64
	}
}

// Device returns a Buffer over device memory at ptr (a CUdeviceptr).
func Device(ptr uintptr, count int, dtype DType) Buffer {
	return Buffer{dev: ptr, count: count, dtype: dtype, device: true}
}

// DevicePointer returns a device buffer's address.
func (b Buffer) DevicePointer() uintptr { return b.dev }

func (b Buffer) Len() int       { return b.count }
func (b Buffer) DType() DType   { return b.dtype }
func (b Buffer) Bytes() int     { return b.count * b.dtype.Size() }
func (b Buffer) OnDevice() bool { return b.device }

// Slice returns the elements [from, to) of b.
func (b Buffer) Slice(from, to int) Buffer {
	if from < 0 || to > b.count || from > to {
		panic(fmt.Sprintf("comm: slice [%d:%d] of a buffer of %d", from, to, b.count))
	}
	if b.device {
		return Buffer{dev: b.dev + uintptr(from*b.dtype.Size()), count: to - from, dtype: b.dtype, device: true}
	}
	if from == to {
		return Buffer{dtype: b.dtype}
	}
	return Buffer{ptr: unsafe.Add(b.ptr, from*b.dtype.Size()), count: to - from, dtype: b.dtype}
}

// HostBytes returns a host buffer's memory as bytes. It panics on a device buffer.
func (b Buffer) HostBytes() []byte {
	if b.device {
		panic("comm: HostBytes of a device buffer")
	}
	if b.count == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(b.ptr), b.Bytes())
}

// Float32s, Float64s, Int32s and Int64s view a host buffer as a typed slice.
// Each panics when the dtype differs or the buffer is on a device.
func (b Buffer) Float32s() []float32 { return view[float32](b, Float32) }
func (b Buffer) Float64s() []float64 { return view[float64](b, Float64) }
func (b Buffer) Int32s() []int32     { return view[int32](b, Int32) }
func (b Buffer) Int64s() []int64     { return view[int64](b, Int64) }

func view[T any](b Buffer, want DType) []T {
	if b.device || b.dtype != want {
		panic(fmt.Sprintf("comm: %s view of a %s buffer (device=%v)", want, b.dtype, b.device))
	}
	if b.count == 0 {
		return nil
	}
	return unsafe.Slice((*T)(b.ptr), b.count)
}

// Comm is a communicator: a fixed group of ranks that run collectives together.
// Every rank must call the same collectives in the same order with matching
// dtypes and counts. send and recv may be the same buffer (in place). A Comm is
// not safe for concurrent use: one collective at a time.
type Comm interface {
	Rank() int
	Size() int
	// AllReduce leaves op over every rank's send in every rank's recv.
	// send and recv have the same length.
	AllReduce(ctx context.Context, send, recv Buffer, op Op) error
	// Broadcast copies root's buf into every other rank's buf.
	Broadcast(ctx context.Context, buf Buffer, root int) error
	// AllGather concatenates every rank's send, in rank order, into recv,
	// which holds Size() × send.Len() elements.
	AllGather(ctx context.Context, send, recv Buffer) error
	// ReduceScatter reduces send (Size() × recv.Len() elements) over every
	// rank and leaves block r of the result in rank r's recv.
	ReduceScatter(ctx context.Context, send, recv Buffer, op Op) error
	// Barrier returns when every rank has entered it.
	Barrier(ctx context.Context) error
	// Close releases the communicator's connections. It does not wait for peers.
	Close() error
}

// Store is the key-value rendezvous a backend uses to find its peers: rank 0
// publishes (an NCCL unique id), or each rank publishes its address (CPU
// backend), and the others wait for it. Keys are scoped by communicator and
// generation by the caller. The agent serves it, relaying to the coordinator.
type Store interface {
	// Put stores value under key. Putting a key twice with different values fails.
	Put(ctx context.Context, key string, value []byte) error
	// Get waits until key exists or ctx is done.
	Get(ctx context.Context, key string) ([]byte, error)
}

// ErrClosed is returned by collectives on a closed communicator.
var ErrClosed = errors.New("comm: communicator is closed")

// CheckShapes returns an error unless send and recv hold the same dtype and
// recv holds recvPerSend × send.Len() elements.
func CheckShapes(opName string, send, recv Buffer, recvPerSend int) error {
	if send.dtype != recv.dtype {
		return fmt.Errorf("comm: %s: send is %s but recv is %s", opName, send.dtype, recv.dtype)
	}
	if recv.count != send.count*recvPerSend {
		return fmt.Errorf("comm: %s: recv holds %d elements, want %d (send %d × %d)", opName, recv.count, send.count*recvPerSend, send.count, recvPerSend)
	}
	return nil
}
