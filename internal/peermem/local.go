package peermem

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"

	"github.com/gotrain/gotrain/gpu/cudadrv"
	"github.com/gotrain/gotrain/worker/comm"
)

// Local is a rank's own side of a copy-engine reduction: one device
// allocation holding the inbox the other ranks copy into, then the 32-bit
// step flags they raise, exported for CUDA IPC; and the kernel that adds
// what arrived. pairreduce and nodereduce lay out their inboxes and flags
// differently; how they come to exist is the same.
type Local struct {
	Ctx      cudadrv.Context
	BusID    string // the device's PCI bus id, for telling shared GPUs apart
	SMs      int    // the device's multiprocessors, for the kernel's grid
	Alloc    cudadrv.DevicePtr
	FlagsOff int                  // bytes from Alloc to the flags: the inbox rounded up to 256
	Handle   cudadrv.IPCMemHandle // Alloc's, for the other ranks to map
	Mod      cudadrv.Module
	Kernel   cudadrv.Function

	relMu            sync.Mutex // orders Release (from an abort, any goroutine) against Close
	released, closed bool
}

// SetUp runs on the device's thread: it allocates an inbox of inboxBytes
// and flagWords zeroed flags after it, exports the allocation, and loads
// kernel from ptx (named what in errors). It returns the current device.
// On an error what it made stays in l, for Close.
func (l *Local) SetUp(inboxBytes, flagWords int, ptx, kernel, what string) (dev cudadrv.Device, err error) {
	l.FlagsOff = (inboxBytes + 255) &^ 255
	if l.Ctx, err = cudadrv.CurrentContext(); err != nil {
		return dev, err
	}
	if dev, err = cudadrv.CurrentDevice(); err != nil {
		return dev, err
	}
	if l.BusID, err = dev.PCIBusID(); err != nil {
		return dev, err
	}
	if l.SMs, err = dev.Attribute(cudadrv.AttrMultiprocessorCount); err != nil {
		return dev, err
	}
	if l.Alloc, err = cudadrv.MemAlloc(l.FlagsOff + 4*flagWords); err != nil {
		return dev, fmt.Errorf("allocate the %d MB inbox: %w", l.FlagsOff>>20, err)
	}
	if err = cudadrv.MemsetD32(l.Alloc+cudadrv.DevicePtr(l.FlagsOff), 0, flagWords); err != nil {
		return dev, err
	}
	if l.Handle, err = cudadrv.IPCGetMemHandle(l.Alloc); err != nil {
		return dev, err
	}
	if l.Mod, err = cudadrv.LoadModule(ptx); err != nil {
		return dev, fmt.Errorf("load the %s kernel: %w", what, err)
	}
	l.Kernel, err = l.Mod.Function(kernel)
	return dev, err
}

// Release raises the flags flags() names to v (WriteFlags), once, unless
// the transport is closing: for an abort, when a peer is gone, so that
// every stream waiting on them goes on. It returns once the writes are
// done, so Close never frees the flags under a pending write.
func (l *Local) Release(flags func() []cudadrv.DevicePtr, v uint32) {
	l.relMu.Lock()
	defer l.relMu.Unlock()
	if l.released || l.closed {
		return
	}
	l.released = true
	WriteFlags(l.Ctx, flags(), v)
}

// Closing marks the transport as closing: a Release after it does nothing,
// and one in progress has finished its writes when Closing returns. Call
// it first in the transport's Close.
func (l *Local) Closing() {
	l.relMu.Lock()
	l.closed = true
	l.relMu.Unlock()
}

// Close unloads the kernel and frees the allocation, on the device's
// thread; it may be called on a half set-up Local, and again.
func (l *Local) Close() error {
	var errs []error
	if l.Mod != 0 {
		errs = append(errs, l.Mod.Unload())
	}
	if l.Alloc != 0 {
		errs = append(errs, l.Alloc.Free())
	}
	l.Mod, l.Kernel, l.Alloc = 0, 0, 0
	return errors.Join(errs...)
}

// Exchange gives every rank of c every rank's record (mine, the same
// length on all ranks), rank by rank.
func Exchange(ctx context.Context, c comm.Comm, mine []int32) ([][]int32, error) {
	n := len(mine)
	all := make([]int32, c.Size()*n)
	if err := c.AllGather(ctx, comm.Host(mine), comm.Host(all)); err != nil {
		return nil, fmt.Errorf("exchange memory handles: %w", err)
	}
	out := make([][]int32, c.Size())
	for j := range out {
		out[j] = all[j*n : (j+1)*n]
	}
	return out, nil
}

// Agree tells every rank of c whether each rank could map the others'
// memory (reason "" where it could) and returns whether all could.
func Agree(ctx context.Context, c comm.Comm, reason string) (bool, error) {
	ok := []int32{1}
	if reason != "" {
		ok[0] = 0
	}
	if err := c.AllReduce(ctx, comm.Host(ok), comm.Host(ok), comm.Min); err != nil {
		return false, fmt.Errorf("agree on the transport: %w", err)
	}
	return ok[0] == 1, nil
}

// Words packs b (a multiple of 4 bytes long) into little-endian int32s,
// the element type the records travel as.
func Words(b []byte) []int32 {
	out := make([]int32, len(b)/4)
	for i := range out {
		out[i] = int32(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return out
}

// Bytes is the inverse of Words.
func Bytes(w []int32) []byte {
	b := make([]byte, 0, 4*len(w))
	for _, v := range w {
		b = binary.LittleEndian.AppendUint32(b, uint32(v))
	}
	return b
}

// Place is where a rank runs, as its record tells the others.
type Place struct {
	Node, Process uint64 // NodeID and ProcessID
	BusID         string // its GPU's PCI bus id
}

// PeerDevice returns the GPU of rank j (at theirs), seen from this rank
// (at mine, on dev), or why this rank cannot address that GPU's memory:
// another node, a GPU this process does not see, no peer path.
func PeerDevice(dev cudadrv.Device, mine, theirs Place, j int) (cudadrv.Device, string) {
	if theirs.Node != mine.Node {
		return 0, fmt.Sprintf("rank %d is on another node", j)
	}
	peerDev, err := cudadrv.DeviceByPCIBusID(theirs.BusID)
	if err != nil {
		return 0, fmt.Sprintf("rank %d's GPU %s is not visible to this process (CUDA_VISIBLE_DEVICES): %v", j, theirs.BusID, err)
	}
	if peerDev != dev {
		can, err := dev.CanAccessPeer(peerDev)
		if err != nil || !can {
			return 0, fmt.Sprintf("GPU %s cannot access GPU %s of rank %d peer to peer (%v)", mine.BusID, theirs.BusID, j, err)
		}
	}
	return peerDev, ""
}

// EnablePeer lets the current context address peerDev's memory (ranks of
// one process on two GPUs share pointers): it retains peerDev's primary
// context, which the caller releases at Close when retained, and enables
// peer access to it; reason says why it could not.
func EnablePeer(peerDev cudadrv.Device, busID string) (retained bool, reason string) {
	pctx, err := peerDev.RetainPrimaryContext()
	if err != nil {
		return false, err.Error()
	}
	if err := cudadrv.EnablePeerAccess(pctx); err != nil {
		return true, fmt.Sprintf("enable peer access to GPU %s: %v", busID, err)
	}
	return true, ""
}
