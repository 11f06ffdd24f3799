//go:build cuda

package cudago

import (
	"unsafe"

	"gorgonia.org/cu"
)

// Stream is a CUDA stream of a Device: work on it runs in order; work on
// different streams may overlap. Methods are safe for concurrent use.
type Stream struct {
	d     *Device
	s     cu.Stream
	owned bool // created by NewStream: Close destroys it

	// ev orders other streams after this one (WaitFor); created on first
	// use. Touched only on the device's thread.
	ev    cu.Event
	hasEv bool
}

// NewStream creates a non-blocking stream (it does not synchronize with the
// legacy default stream) in the device's primary context.
func (d *Device) NewStream() (*Stream, error) {
	s := &Stream{d: d, owned: true}
	err := d.do("create a stream", func() (err error) {
		s.s, err = cu.MakeStream(cu.NonBlocking)
		return err
	})
	if err != nil {
		return nil, err
	}
	return s, nil
}

// WrapStream returns a Stream over a stream handle (a CUstream) created
// elsewhere in the same context, such as c.Stream() of the
// ncclcomm.Comm on the same device, to order work against it with WaitFor.
// Make it once and keep it: Close frees the event WaitFor records on, but
// does not destroy a wrapped stream.
func (d *Device) WrapStream(handle uintptr) *Stream {
	return &Stream{d: d, s: streamOf(handle)}
}

// The conversions between cu.Stream and a handle rely on cu.Stream holding
// exactly one CUstream; these fail to compile if its size changes.
var (
	_ [unsafe.Sizeof(cu.Stream{}) - unsafe.Sizeof(uintptr(0))]struct{}
	_ [unsafe.Sizeof(uintptr(0)) - unsafe.Sizeof(cu.Stream{})]struct{}
)

func streamOf(handle uintptr) cu.Stream { return *(*cu.Stream)(unsafe.Pointer(&handle)) }

// CU returns the stream as gorgonia.org/cu names it, for use inside Do
// (cu.MemcpyDtoDAsync(…, s.CU()), Function.Launch(…, s.CU(), …)).
func (s *Stream) CU() cu.Stream { return s.s }

// Handle returns the CUstream, for libraries that take one (cuBLAS, NCCL).
func (s *Stream) Handle() uintptr { return uintptr(unsafe.Pointer(s.s.C())) }

// Device returns the stream's device.
func (s *Stream) Device() *Device { return s.d }

// Synchronize waits until the work enqueued on s so far has finished.
func (s *Stream) Synchronize() error {
	return s.d.do("synchronize a stream", s.s.Synchronize)
}

// WaitFor makes the work enqueued on s from now on wait for the work
// enqueued on other so far, without blocking the host (an event recorded on
// other, waited for on s). Both must be streams of the same context.
func (s *Stream) WaitFor(other *Stream) error {
	return s.d.do("order a stream after another", func() error {
		if !s.hasEv {
			ev, err := cu.MakeEvent(cu.DisableTiming)
			if err != nil {
				return err
			}
			s.ev, s.hasEv = ev, true
		}
		// A wait uses the event's record at the time of the call, so one
		// event serves every WaitFor of s.
		if err := s.ev.Record(other.s); err != nil {
			return err
		}
		return s.s.Wait(s.ev, 0)
	})
}

// Close destroys the stream (unless it was wrapped); work already enqueued
// still runs. Closing twice is a no-op.
func (s *Stream) Close() error {
	return s.d.do("destroy a stream", func() error {
		if s.hasEv {
			s.hasEv = false
			if err := cu.DestroyEvent(&s.ev); err != nil {
				return err
			}
		}
		if s.owned {
			s.owned = false
			return s.s.Destroy()
		}
		return nil
	})
}
