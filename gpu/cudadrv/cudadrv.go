// Package cudadrv is the small part of the CUDA driver API that gotrain
// needs (device facts, primary contexts, memory, streams, events, modules
// and kernel launches, CUDA IPC) for its own GPU work: the NCCL tests,
// `gotrain bench`, `gotrain doctor`, the copy-engine transports. It is
// public so that a Go GPU training program (examples/mlp) can use the same
// driver binding as package worker and nccl, whose streams and device
// pointers are plain uintptrs of it.
//
// Like package nccl it dlopens libcuda.so.1 at run time, with gotrain's own
// declarations and no cuda.h, so binaries build without CUDA and start
// without a GPU; Load then returns one plain line saying the driver is
// missing.
//
// CUDA contexts are current per OS thread: lock the goroutine to its thread
// (runtime.LockOSThread) before Context.SetCurrent and keep it locked while it
// uses that device.
package cudadrv

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"
	"unsafe"
)

const notLoaded = -1

// cudaErrorNotReady is CUDA_ERROR_NOT_READY, the answer of a query on work
// that has not finished.
const cudaErrorNotReady = 600

// ErrNotLoaded is returned by calls made before Load succeeded.
var ErrNotLoaded = errors.New("cudadrv: the CUDA driver is not loaded (call Load first)")

// ErrNotFound matches Load's error when no driver library could be opened.
var ErrNotFound = errors.New("cudadrv: CUDA driver not found")

// Error is a failed driver call: a CUresult with the driver's name and text for it.
type Error struct {
	Op      string // e.g. "cuMemAlloc"
	Code    int    // the CUresult
	Name    string // cuGetErrorName, e.g. "CUDA_ERROR_OUT_OF_MEMORY"
	Message string // cuGetErrorString
}

func (e *Error) Error() string {
	name, msg := e.Name, e.Message
	if name == "" {
		name = fmt.Sprintf("CUresult %d", e.Code)
	}
	if msg == "" {
		return fmt.Sprintf("cudadrv: %s: %s", e.Op, name)
	}
	return fmt.Sprintf("cudadrv: %s: %s: %s", e.Op, name, msg)
}

func check(op string, r int) error {
	switch r {
	case 0:
		return nil
	case notLoaded:
		return ErrNotLoaded
	}
	return &Error{Op: op, Code: r, Name: cErrorName(r), Message: cErrorString(r)}
}

// Driver is the loaded and initialized CUDA driver.
type Driver struct {
	path    string
	version int
}

// Path returns the library Load opened.
func (d *Driver) Path() string { return d.path }

// Version returns cuDriverGetVersion's answer: 13000 for CUDA 13.0.
func (d *Driver) Version() int { return d.version }

// VersionString returns Version as "13.0".
func (d *Driver) VersionString() string {
	return fmt.Sprintf("%d.%d", d.version/1000, d.version%1000/10)
}

// Places Load tries after the dynamic loader's path.
var fallbackPaths = []string{
	"/usr/lib/x86_64-linux-gnu/libcuda.so.1",
	"/usr/lib64/libcuda.so.1",
	"/usr/local/nvidia/lib64/libcuda.so.1", // containers with the driver mounted
	"/usr/lib/wsl/lib/libcuda.so.1",        // WSL2
}

var (
	loadMu sync.Mutex
	loaded *Driver
)

// Load opens libcuda.so.1 and calls cuInit, or returns the Driver it loaded
// before. A failure is not remembered.
func Load() (*Driver, error) {
	loadMu.Lock()
	defer loadMu.Unlock()
	if loaded != nil {
		return loaded, nil
	}
	path, err := open(append([]string{"libcuda.so.1"}, fallbackPaths...))
	if err != nil {
		return nil, err
	}
	if err := check("cuInit", cInit()); err != nil {
		return nil, err
	}
	v, r := cDriverVersion()
	if err := check("cuDriverGetVersion", r); err != nil {
		return nil, err
	}
	loaded = &Driver{path: path, version: v}
	return loaded, nil
}

// notFoundError is Load's one-line error when no library opened.
type notFoundError struct {
	first string   // the loader's answer for the soname
	also  []string // the other paths tried
}

func (e *notFoundError) Error() string {
	return fmt.Sprintf("cudadrv: CUDA driver not found (%s; also tried %s): install the NVIDIA driver, or run on a machine with an NVIDIA GPU",
		e.first, strings.Join(e.also, ", "))
}

func (e *notFoundError) Is(target error) bool { return target == ErrNotFound }

func open(paths []string) (string, error) {
	nf := &notFoundError{}
	for i, p := range paths {
		msg := cOpen(p)
		if msg == "" {
			return p, nil
		}
		if i == 0 {
			nf.first = msg
		} else {
			nf.also = append(nf.also, p)
		}
	}
	return "", nf
}

// DeviceCount returns the number of CUDA devices (cuDeviceGetCount).
func (d *Driver) DeviceCount() (int, error) {
	n, r := cDeviceCount()
	return n, check("cuDeviceGetCount", r)
}

// Device returns the device of ordinal i (cuDeviceGet).
func (d *Driver) Device(i int) (Device, error) {
	dev, r := cDeviceGet(i)
	return dev, check("cuDeviceGet", r)
}

// Device is a CUdevice.
type Device int32

// Name returns the device's name, e.g. "NVIDIA H200".
func (dev Device) Name() (string, error) {
	s, r := cDeviceName(dev)
	return s, check("cuDeviceGetName", r)
}

// PCIBusID returns the device's PCI bus id, e.g. "0000:00:06.0".
func (dev Device) PCIBusID() (string, error) {
	s, r := cDevicePCIBusID(dev)
	return s, check("cuDeviceGetPCIBusId", r)
}

// The CUdevice_attribute values Attribute callers use most.
const (
	AttrComputeCapabilityMajor = 75
	AttrComputeCapabilityMinor = 76
	AttrMultiprocessorCount    = 16
)

// Attribute returns a CUdevice_attribute of the device (cuDeviceGetAttribute).
func (dev Device) Attribute(attr int) (int, error) {
	v, r := cDeviceAttribute(attr, dev)
	return v, check("cuDeviceGetAttribute", r)
}

// ComputeCapability returns the device's compute capability, e.g. 9, 0.
func (dev Device) ComputeCapability() (major, minor int, err error) {
	if major, err = dev.Attribute(AttrComputeCapabilityMajor); err != nil {
		return 0, 0, err
	}
	minor, err = dev.Attribute(AttrComputeCapabilityMinor)
	return major, minor, err
}

// TotalMem returns the device's memory in bytes (cuDeviceTotalMem).
func (dev Device) TotalMem() (uint64, error) {
	n, r := cDeviceTotalMem(dev)
	return n, check("cuDeviceTotalMem", r)
}

// RetainPrimaryContext returns the device's primary context, the one the
// CUDA runtime (and so NCCL and PyTorch) use, and holds a reference to it
// (cuDevicePrimaryCtxRetain). Release it with ReleasePrimaryContext.
func (dev Device) RetainPrimaryContext() (Context, error) {
	c, r := cPrimaryCtxRetain(dev)
	return c, check("cuDevicePrimaryCtxRetain", r)
}

// ReleasePrimaryContext drops a reference RetainPrimaryContext took.
func (dev Device) ReleasePrimaryContext() error {
	return check("cuDevicePrimaryCtxRelease", cPrimaryCtxRelease(dev))
}

// Context is a CUcontext.
type Context uintptr

// SetCurrent makes c the calling OS thread's current context
// (cuCtxSetCurrent). Lock the goroutine to its thread first.
func (c Context) SetCurrent() error { return check("cuCtxSetCurrent", cCtxSetCurrent(c)) }

// CurrentContext returns the calling thread's current context, 0 if none.
func CurrentContext() (Context, error) {
	c, r := cCtxGetCurrent()
	return c, check("cuCtxGetCurrent", r)
}

// Synchronize waits for all work of the current context (cuCtxSynchronize).
func Synchronize() error { return check("cuCtxSynchronize", cCtxSynchronize()) }

// DevicePtr is a CUdeviceptr: an address in device memory, never
// dereferenced by Go. It converts to the uintptr package nccl takes.
type DevicePtr uintptr

// MemAlloc allocates bytes of device memory in the current context (cuMemAlloc).
func MemAlloc(bytes int) (DevicePtr, error) {
	if bytes <= 0 {
		return 0, fmt.Errorf("cudadrv: MemAlloc of %d bytes", bytes)
	}
	p, r := cMemAlloc(bytes)
	return p, check("cuMemAlloc", r)
}

// Free frees memory from MemAlloc (cuMemFree).
func (p DevicePtr) Free() error { return check("cuMemFree", cMemFree(p)) }

// MemsetD8 sets n bytes at p to v (cuMemsetD8).
func MemsetD8(p DevicePtr, v uint8, n int) error { return check("cuMemsetD8", cMemsetD8(p, v, n)) }

// MemsetD32 sets n 32-bit words at p to v (cuMemsetD32).
func MemsetD32(p DevicePtr, v uint32, n int) error {
	return check("cuMemsetD32", cMemsetD32(p, v, n))
}

// MemsetD8Async enqueues MemsetD8 on s.
func MemsetD8Async(p DevicePtr, v uint8, n int, s Stream) error {
	return check("cuMemsetD8Async", cMemsetD8Async(p, v, n, s))
}

// MemsetD32Async enqueues MemsetD32 on s.
func MemsetD32Async(p DevicePtr, v uint32, n int, s Stream) error {
	return check("cuMemsetD32Async", cMemsetD32Async(p, v, n, s))
}

func byteLen[T any](s []T) int {
	var z T
	return len(s) * int(unsafe.Sizeof(z))
}

// CopyToDevice copies src into device memory at dst (cuMemcpyHtoD). T must
// hold no Go pointers.
func CopyToDevice[T any](dst DevicePtr, src []T) error {
	if len(src) == 0 {
		return nil
	}
	return check("cuMemcpyHtoD", cMemcpyHtoD(dst, unsafe.Pointer(unsafe.SliceData(src)), byteLen(src)))
}

// CopyFromDevice fills dst from device memory at src (cuMemcpyDtoH). T must
// hold no Go pointers.
func CopyFromDevice[T any](dst []T, src DevicePtr) error {
	if len(dst) == 0 {
		return nil
	}
	return check("cuMemcpyDtoH", cMemcpyDtoH(unsafe.Pointer(unsafe.SliceData(dst)), src, byteLen(dst)))
}

// CopyDeviceToDevice copies bytes between device buffers (cuMemcpyDtoD).
func CopyDeviceToDevice(dst, src DevicePtr, bytes int) error {
	return check("cuMemcpyDtoD", cMemcpyDtoD(dst, src, bytes))
}

// CopyToDeviceAsync enqueues a copy of src to dst on s (cuMemcpyHtoDAsync).
// Go memory is pageable, so the driver stages it before the call returns:
// src may be reused at once, but the copy gains no overlap with the host.
func CopyToDeviceAsync[T any](dst DevicePtr, src []T, s Stream) error {
	if len(src) == 0 {
		return nil
	}
	return check("cuMemcpyHtoDAsync", cMemcpyHtoDAsync(dst, unsafe.Pointer(unsafe.SliceData(src)), byteLen(src), s))
}

// CopyFromDeviceAsync copies src into dst after the work queued on s
// (cuMemcpyDtoHAsync). Into pageable Go memory the driver returns only when
// the copy is done, so dst is ready when it returns.
func CopyFromDeviceAsync[T any](dst []T, src DevicePtr, s Stream) error {
	if len(dst) == 0 {
		return nil
	}
	return check("cuMemcpyDtoHAsync", cMemcpyDtoHAsync(unsafe.Pointer(unsafe.SliceData(dst)), src, byteLen(dst), s))
}

// Stream is a CUstream; 0 is the legacy default stream.
type Stream uintptr

// StreamNonBlocking is CU_STREAM_NON_BLOCKING: the stream does not
// synchronize with the legacy default stream.
const StreamNonBlocking = 1

// NewStream creates a stream in the current context (cuStreamCreate).
func NewStream(flags uint32) (Stream, error) {
	s, r := cStreamCreate(flags)
	return s, check("cuStreamCreate", r)
}

// Synchronize waits for the work queued on s (cuStreamSynchronize).
func (s Stream) Synchronize() error { return check("cuStreamSynchronize", cStreamSynchronize(s)) }

// Done reports whether the work queued on s has finished (cuStreamQuery).
func (s Stream) Done() (bool, error) { return queryDone("cuStreamQuery", cStreamQuery(s)) }

// Destroy destroys s (cuStreamDestroy).
func (s Stream) Destroy() error { return check("cuStreamDestroy", cStreamDestroy(s)) }

func queryDone(op string, r int) (bool, error) {
	if r == cudaErrorNotReady {
		return false, nil
	}
	return r == 0, check(op, r)
}

// Event is a CUevent.
type Event uintptr

// Event flags (CUevent_flags).
const (
	EventDefault       = 0
	EventBlockingSync  = 1
	EventDisableTiming = 2
)

// NewEvent creates an event in the current context (cuEventCreate).
func NewEvent(flags uint32) (Event, error) {
	e, r := cEventCreate(flags)
	return e, check("cuEventCreate", r)
}

// Record enqueues e on s (cuEventRecord).
func (e Event) Record(s Stream) error { return check("cuEventRecord", cEventRecord(e, s)) }

// Done reports whether the work before e's record has finished (cuEventQuery).
func (e Event) Done() (bool, error) { return queryDone("cuEventQuery", cEventQuery(e)) }

// Synchronize waits for e (cuEventSynchronize).
func (e Event) Synchronize() error { return check("cuEventSynchronize", cEventSynchronize(e)) }

// Destroy destroys e (cuEventDestroy).
func (e Event) Destroy() error { return check("cuEventDestroy", cEventDestroy(e)) }

// Elapsed returns the GPU time between two recorded, completed events
// (cuEventElapsedTime; about 0.5 µs resolution).
func Elapsed(start, end Event) (time.Duration, error) {
	ms, r := cEventElapsedTime(start, end)
	if err := check("cuEventElapsedTime", r); err != nil {
		return 0, err
	}
	return time.Duration(float64(ms) * float64(time.Millisecond)), nil
}
