package cudadrv

// The peer calls: device memory one process shares with another (legacy
// CUDA IPC), peer access between the devices of one node, and the stream
// memory operations with which a stream writes a flag in a peer's memory
// and another stream waits for it, neither host nor SM involved.

var peerCalls = callSet{open: cPeerOpen}

func openPeerCalls() error { return peerCalls.ensure() }

// cudaErrorPeerAccessAlreadyEnabled is CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED.
const cudaErrorPeerAccessAlreadyEnabled = 704

// IPCMemHandle names a device allocation for other processes of the node
// (a CUipcMemHandle).
type IPCMemHandle [64]byte

// IPCGetMemHandle returns the handle of the allocation p, which must be the
// start of a MemAlloc of this process (cuIpcGetMemHandle).
func IPCGetMemHandle(p DevicePtr) (IPCMemHandle, error) {
	if err := openPeerCalls(); err != nil {
		return IPCMemHandle{}, err
	}
	h, r := cIPCGetMemHandle(p)
	return h, check("cuIpcGetMemHandle", r)
}

// IPCOpenMemHandle maps another process's allocation into the current
// context, enabling peer access to its device as needed
// (cuIpcOpenMemHandle, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS). A process cannot
// open its own handles. Unmap it with IPCCloseMemHandle.
func IPCOpenMemHandle(h IPCMemHandle) (DevicePtr, error) {
	if err := openPeerCalls(); err != nil {
		return 0, err
	}
	p, r := cIPCOpenMemHandle(h)
	return p, check("cuIpcOpenMemHandle", r)
}

// IPCCloseMemHandle unmaps what IPCOpenMemHandle mapped (cuIpcCloseMemHandle).
func IPCCloseMemHandle(p DevicePtr) error {
	if err := openPeerCalls(); err != nil {
		return err
	}
	return check("cuIpcCloseMemHandle", cIPCCloseMemHandle(p))
}

// CurrentDevice returns the device of the calling thread's current context
// (cuCtxGetDevice).
func CurrentDevice() (Device, error) {
	if err := openPeerCalls(); err != nil {
		return 0, err
	}
	d, r := cCtxGetDevice()
	return d, check("cuCtxGetDevice", r)
}

// DeviceByPCIBusID returns the visible device with the PCI bus id, e.g.
// "0000:00:07.0" (cuDeviceGetByPCIBusId); an error when no visible device
// has it.
func DeviceByPCIBusID(id string) (Device, error) {
	if err := openPeerCalls(); err != nil {
		return 0, err
	}
	d, r := cDeviceByPCIBusID(id)
	return d, check("cuDeviceGetByPCIBusId", r)
}

// CanAccessPeer reports whether dev can map peer's memory (NVLink or PCIe
// peer to peer; cuDeviceCanAccessPeer).
func (dev Device) CanAccessPeer(peer Device) (bool, error) {
	if err := openPeerCalls(); err != nil {
		return false, err
	}
	ok, r := cDeviceCanAccessPeer(dev, peer)
	return ok, check("cuDeviceCanAccessPeer", r)
}

// EnablePeerAccess lets the current context access peer's memory
// (cuCtxEnablePeerAccess); access already enabled is not an error.
func EnablePeerAccess(peer Context) error {
	if err := openPeerCalls(); err != nil {
		return err
	}
	r := cCtxEnablePeerAccess(peer)
	if r == cudaErrorPeerAccessAlreadyEnabled {
		return nil
	}
	return check("cuCtxEnablePeerAccess", r)
}

// WriteValue32 enqueues on s a write of v to the 32-bit word at addr, which
// may be in a peer's memory; the writes s enqueued before it are visible
// first (cuStreamWriteValue32 with its default memory barrier).
func (s Stream) WriteValue32(addr DevicePtr, v uint32) error {
	if err := openPeerCalls(); err != nil {
		return err
	}
	return check("cuStreamWriteValue32", cStreamWriteValue32(s, addr, v, 0))
}

// WaitValue32 makes the work enqueued on s after this call wait until the
// 32-bit word at addr, read as a serial number, is at least v:
// int32(*addr - v) >= 0, so that counters may wrap
// (cuStreamWaitValue32, CU_STREAM_WAIT_VALUE_GEQ).
func (s Stream) WaitValue32(addr DevicePtr, v uint32) error {
	if err := openPeerCalls(); err != nil {
		return err
	}
	return check("cuStreamWaitValue32", cStreamWaitValue32(s, addr, v, 0))
}

// MemGetAddressRange returns the start and size in bytes of the allocation
// that holds p (cuMemGetAddressRange): IPCGetMemHandle needs the start.
func MemGetAddressRange(p DevicePtr) (base DevicePtr, bytes int, err error) {
	if err := openPeerCalls(); err != nil {
		return 0, 0, err
	}
	base, bytes, r := cMemGetAddressRange(p)
	return base, bytes, check("cuMemGetAddressRange", r)
}
