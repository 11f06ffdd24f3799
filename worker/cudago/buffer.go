//go:build cuda

package cudago

import (
	"fmt"
	"unsafe"

	"github.com/gotrain/gotrain/worker/comm"
	"gorgonia.org/cu"
)

// DeviceBuffer is n elements of T in a Device's memory. Buffer names it for
// collectives (NCCL reads and writes it in place: no copies). A DeviceBuffer
// is not safe for concurrent use with Free.
type DeviceBuffer[T comm.Element] struct {
	d   *Device
	ptr cu.DevicePtr
	n   int
}

// Alloc allocates n elements of T (uninitialized) on d. (A function, not a
// method: Go methods have no type parameters.)
func Alloc[T comm.Element](d *Device, n int) (*DeviceBuffer[T], error) {
	b := &DeviceBuffer[T]{d: d, n: n}
	if n < 0 {
		return nil, fmt.Errorf("cudago: allocate %d elements: want 0 or more", n)
	}
	if n == 0 {
		return b, nil
	}
	err := d.do(fmt.Sprintf("allocate %d × %s (%d bytes)", n, b.DType(), b.Bytes()), func() (err error) {
		b.ptr, err = cu.MemAlloc(int64(b.Bytes()))
		return err
	})
	if err != nil {
		return nil, err
	}
	return b, nil
}

// Len returns the number of elements.
func (b *DeviceBuffer[T]) Len() int { return b.n }

// Bytes returns the size in bytes.
func (b *DeviceBuffer[T]) Bytes() int { return b.n * int(unsafe.Sizeof(*new(T))) }

// DType returns the element type as package comm names it.
func (b *DeviceBuffer[T]) DType() comm.DType { return comm.Host([]T(nil)).DType() }

// Ptr returns the device address, for use inside Do (kernel arguments,
// cu.Memcpy…). It is 0 for an empty buffer.
func (b *DeviceBuffer[T]) Ptr() cu.DevicePtr { return b.ptr }

// Device returns the buffer's device.
func (b *DeviceBuffer[T]) Device() *Device { return b.d }

// Buffer returns the comm.Buffer over b's device memory, for the collectives
// of worker.Comm (ncclcomm): comm.Device(ptr, n, dtype).
func (b *DeviceBuffer[T]) Buffer() comm.Buffer {
	return comm.Device(uintptr(b.ptr), b.n, b.DType())
}

func (b *DeviceBuffer[T]) check(op string, n int) error {
	if n > b.n {
		return fmt.Errorf("cudago: %s %d elements: the buffer holds %d", op, n, b.n)
	}
	return nil
}

// CopyIn copies src to the start of b and returns when the copy is done.
// Like cuMemcpyHtoD it does not wait for work on b's device's streams: when
// a stream may still use b, use CopyInOn.
func (b *DeviceBuffer[T]) CopyIn(src []T) error {
	if err := b.check("copy in", len(src)); err != nil || len(src) == 0 {
		return err
	}
	return b.d.do("copy to the device", func() error {
		return cu.MemcpyHtoD(b.ptr, unsafe.Pointer(unsafe.SliceData(src)), int64(byteLen(src)))
	})
}

// CopyOut copies the first len(dst) elements of b into dst and returns when
// the copy is done. Like CopyIn it does not wait for work on streams: use
// CopyOutOn for results a stream computes.
func (b *DeviceBuffer[T]) CopyOut(dst []T) error {
	if err := b.check("copy out", len(dst)); err != nil || len(dst) == 0 {
		return err
	}
	return b.d.do("copy from the device", func() error {
		return cu.MemcpyDtoH(unsafe.Pointer(unsafe.SliceData(dst)), b.ptr, int64(byteLen(dst)))
	})
}

// CopyInOn enqueues the copy of src to the start of b on s, after the work
// already there, and waits for s: when it returns, src may change.
func (b *DeviceBuffer[T]) CopyInOn(s *Stream, src []T) error {
	if err := b.check("copy in", len(src)); err != nil || len(src) == 0 {
		return err
	}
	return b.d.do("copy to the device on a stream", func() error {
		if err := cu.MemcpyHtoDAsync(b.ptr, unsafe.Pointer(unsafe.SliceData(src)), int64(byteLen(src)), s.s); err != nil {
			return err
		}
		return s.s.Synchronize()
	})
}

// CopyOutOn enqueues the copy of b's first len(dst) elements into dst on s,
// after the work already there, and waits for s.
func (b *DeviceBuffer[T]) CopyOutOn(s *Stream, dst []T) error {
	if err := b.check("copy out", len(dst)); err != nil || len(dst) == 0 {
		return err
	}
	return b.d.do("copy from the device on a stream", func() error {
		if err := cu.MemcpyDtoHAsync(unsafe.Pointer(unsafe.SliceData(dst)), b.ptr, int64(byteLen(dst)), s.s); err != nil {
			return err
		}
		return s.s.Synchronize()
	})
}

// ZeroOn enqueues setting every byte of b to zero on s and returns at once.
func (b *DeviceBuffer[T]) ZeroOn(s *Stream) error {
	if b.n == 0 {
		return nil
	}
	return b.d.do("zero a buffer", func() error {
		return cu.MemsetD8Async(b.ptr, 0, int64(b.Bytes()), s.s)
	})
}

// Free releases the memory. Let the work that uses b finish first
// (Stream.Synchronize). Freeing twice is a no-op.
func (b *DeviceBuffer[T]) Free() error {
	if b.ptr == 0 {
		return nil
	}
	err := b.d.do("free a buffer", func() error { return cu.MemFree(b.ptr) })
	if err == nil {
		b.ptr, b.n = 0, 0
	}
	return err
}

func byteLen[T any](s []T) int { return len(s) * int(unsafe.Sizeof(*new(T))) }
