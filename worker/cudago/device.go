//go:build cuda

package cudago

import (
	"fmt"
	"sync"

	"github.com/gotrain/gotrain/internal/osthread"
	"gorgonia.org/cu"
)

// Device is one GPU as Go training code uses it: the device's primary
// context, current on an OS thread of its own, where every call of Do (and
// of the Device's streams and buffers) runs. Methods are safe for concurrent
// use; the calls run one at a time.
type Device struct {
	ordinal int
	dev     cu.Device
	ctx     cu.CUContext
	exec    *osthread.Executor

	closeOnce  sync.Once
	releaseErr error // set by teardown, on the thread
}

// OnDevice starts an OS thread for the CUDA device ordinal (as this process
// sees it; worker/ncclcomm.DeviceFor maps a worker's GPU to it), retains the
// device's primary context and makes it current there. The primary context is
// the one the CUDA runtime, NCCL, PyTorch and worker/ncclcomm use, so device
// memory, streams and events are shared with all of them. Close releases it.
func OnDevice(ordinal int) (*Device, error) {
	if ordinal < 0 {
		return nil, fmt.Errorf("cudago: device %d: want a CUDA device ordinal (0 or more)", ordinal)
	}
	d := &Device{ordinal: ordinal}
	e, err := osthread.Start(d.setup, d.teardown)
	if err != nil {
		return nil, err
	}
	d.exec = e
	return d, nil
}

// setup runs first on the device's thread.
func (d *Device) setup() error {
	n, err := cu.NumDevices()
	if err != nil {
		return fmt.Errorf("cudago: count CUDA devices: %w", err)
	}
	if d.ordinal >= n {
		return fmt.Errorf("cudago: CUDA device %d does not exist: this process sees %d device(s) (CUDA_VISIBLE_DEVICES limits them)", d.ordinal, n)
	}
	if d.dev, err = cu.GetDevice(d.ordinal); err != nil {
		return fmt.Errorf("cudago: device %d: %w", d.ordinal, err)
	}
	if d.ctx, err = d.dev.RetainPrimaryCtx(); err != nil {
		return fmt.Errorf("cudago: device %d: retain the primary context: %w", d.ordinal, err)
	}
	if err := cu.SetCurrentContext(d.ctx); err != nil {
		_ = d.dev.ReleasePrimaryCtx()
		return fmt.Errorf("cudago: device %d: make the primary context current: %w", d.ordinal, err)
	}
	return nil
}

// teardown runs last on the device's thread.
func (d *Device) teardown() {
	if err := d.dev.ReleasePrimaryCtx(); err != nil {
		d.releaseErr = fmt.Errorf("cudago: device %d: release the primary context: %w", d.ordinal, err)
	}
}

// Ordinal returns the CUDA device ordinal.
func (d *Device) Ordinal() int { return d.ordinal }

// CUDevice returns the device as gorgonia.org/cu names it.
func (d *Device) CUDevice() cu.Device { return d.dev }

// Context returns the device's primary context.
func (d *Device) Context() cu.CUContext { return d.ctx }

// Do runs fn on the device's thread, where the primary context is current:
// the place for gorgonia.org/cu's context-free functions (cu.MemcpyDtoDAsync,
// Function.Launch, …). Do returns fn's error, or ErrClosed after Close. fn
// must not call the methods of d, its streams or its buffers (they would
// wait for fn); it may use their handles (Stream.CU, DeviceBuffer.Ptr).
func (d *Device) Do(fn func() error) error { return d.run(fn) }

// run runs fn on the device's thread (a panic in fn is raised again in the
// caller) and returns its error, or ErrClosed once the thread has stopped.
func (d *Device) run(fn func() error) error {
	if err := d.exec.Do(fn); err != osthread.ErrStopped {
		return err
	}
	return ErrClosed
}

// Synchronize waits until the device has finished all work in the context,
// on every stream.
func (d *Device) Synchronize() error {
	return d.do("synchronize the context", cu.Synchronize)
}

// do runs fn on the thread and names the device and op in its error.
func (d *Device) do(op string, fn func() error) error {
	if err := d.run(fn); err != nil {
		if err == ErrClosed {
			return err
		}
		return fmt.Errorf("cudago: device %d: %s: %w", d.ordinal, op, err)
	}
	return nil
}

// Close releases the primary context and ends the device's thread. Free the
// buffers and close the streams first: the primary context lives on while
// anyone else (an ncclcomm.Comm) retains it, and so would they.
func (d *Device) Close() error {
	d.closeOnce.Do(d.exec.Stop)
	return d.releaseErr
}
