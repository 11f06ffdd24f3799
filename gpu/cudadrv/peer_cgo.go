//go:build cgo

package cudadrv

// cgo calls of the peer part (peer_shim.c).

/*
#cgo LDFLAGS: -ldl
#include "peer_shim.h"
*/
import "C"

import "unsafe"

func cPeerOpen(path string) string {
	cpath := C.CString(path)
	defer C.free(unsafe.Pointer(cpath))
	var buf [1024]C.char
	if C.gtp_open(cpath, &buf[0], C.size_t(len(buf))) != 0 {
		return C.GoString(&buf[0])
	}
	return ""
}

func cIPCGetMemHandle(p DevicePtr) (IPCMemHandle, int) {
	var h IPCMemHandle
	r := C.gtp_ipc_get_mem_handle((*C.uchar)(unsafe.Pointer(&h[0])), C.uint64_t(p))
	return h, int(r)
}

func cIPCOpenMemHandle(h IPCMemHandle) (DevicePtr, int) {
	var p C.uint64_t
	r := C.gtp_ipc_open_mem_handle(&p, (*C.uchar)(unsafe.Pointer(&h[0])))
	return DevicePtr(p), int(r)
}

func cIPCCloseMemHandle(p DevicePtr) int { return int(C.gtp_ipc_close_mem_handle(C.uint64_t(p))) }

func cCtxGetDevice() (Device, int) {
	var d C.int
	r := C.gtp_ctx_get_device(&d)
	return Device(d), int(r)
}

func cDeviceCanAccessPeer(dev, peer Device) (bool, int) {
	var can C.int
	r := C.gtp_device_can_access_peer(&can, C.int(dev), C.int(peer))
	return can != 0, int(r)
}

func cDeviceByPCIBusID(id string) (Device, int) {
	cid := C.CString(id)
	defer C.free(unsafe.Pointer(cid))
	var d C.int
	r := C.gtp_device_by_pci_bus_id(&d, cid)
	return Device(d), int(r)
}

func cCtxEnablePeerAccess(peer Context) int {
	return int(C.gtp_ctx_enable_peer_access(C.uintptr_t(peer)))
}

func cStreamWriteValue32(s Stream, addr DevicePtr, v uint32, flags uint32) int {
	return int(C.gtp_stream_write_value32(C.uintptr_t(s), C.uint64_t(addr), C.uint32_t(v), C.uint(flags)))
}

func cStreamWaitValue32(s Stream, addr DevicePtr, v uint32, flags uint32) int {
	return int(C.gtp_stream_wait_value32(C.uintptr_t(s), C.uint64_t(addr), C.uint32_t(v), C.uint(flags)))
}

func cMemGetAddressRange(p DevicePtr) (DevicePtr, int, int) {
	var base C.uint64_t
	var size C.size_t
	r := C.gtp_mem_get_address_range(&base, &size, C.uint64_t(p))
	return DevicePtr(base), int(size), int(r)
}
