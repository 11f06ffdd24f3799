// The peer part of gotrain's CUDA driver shim. Like stream_shim.c it
// resolves its own symbols from the libcuda.so.1 that shim.c opened.

//go:build cgo

#include <string.h>

#include "shim.h"
#include "peer_shim.h"

#define GTP_NOT_LOADED (-1)

typedef void *ptr_t;

// CUipcMemHandle: 64 opaque bytes, passed by value to cuIpcOpenMemHandle.
typedef struct {
	char reserved[64];
} ipc_handle_t;

static struct {
	void *handle;
	int (*ipcGetMemHandle)(ipc_handle_t *, uint64_t);
	int (*ipcOpenMemHandle)(uint64_t *, ipc_handle_t, unsigned);
	int (*ipcCloseMemHandle)(uint64_t);
	int (*ctxGetDevice)(int *);
	int (*deviceCanAccessPeer)(int *, int, int);
	int (*deviceGetByPCIBusId)(int *, const char *);
	int (*ctxEnablePeerAccess)(ptr_t, unsigned);
	int (*streamWriteValue32)(ptr_t, uint64_t, uint32_t, unsigned);
	int (*streamWaitValue32)(ptr_t, uint64_t, uint32_t, unsigned);
	int (*memGetAddressRange)(uint64_t *, size_t *, uint64_t);
} fp;

int gtp_open(const char *path, char *err, size_t errlen) {
	if (fp.handle != NULL) {
		return 0;
	}
	// The _v2 names are the ones cuda.h has mapped these calls to since
	// CUDA 11 (IPC) and 11.7 (stream memory operations, always available
	// from CUDA 12 on).
	const gtc_sym syms[] = {
		{(void **)&fp.ipcGetMemHandle, "cuIpcGetMemHandle"},
		{(void **)&fp.ipcOpenMemHandle, "cuIpcOpenMemHandle_v2"},
		{(void **)&fp.ipcCloseMemHandle, "cuIpcCloseMemHandle"},
		{(void **)&fp.ctxGetDevice, "cuCtxGetDevice"},
		{(void **)&fp.deviceCanAccessPeer, "cuDeviceCanAccessPeer"},
		{(void **)&fp.deviceGetByPCIBusId, "cuDeviceGetByPCIBusId"},
		{(void **)&fp.ctxEnablePeerAccess, "cuCtxEnablePeerAccess"},
		{(void **)&fp.streamWriteValue32, "cuStreamWriteValue32_v2"},
		{(void **)&fp.streamWaitValue32, "cuStreamWaitValue32_v2"},
		{(void **)&fp.memGetAddressRange, "cuMemGetAddressRange_v2"},
	};
	fp.handle = gtc_dlopen_syms(path, syms, sizeof syms / sizeof syms[0],
				    "the CUDA IPC, peer access or stream memory operation calls (driver for CUDA 12 or newer needed)",
				    err, errlen);
	return fp.handle != NULL ? 0 : -1;
}

int gtp_ipc_get_mem_handle(unsigned char *handle64, uint64_t ptr) {
	if (fp.handle == NULL) return GTP_NOT_LOADED;
	ipc_handle_t h;
	int r = fp.ipcGetMemHandle(&h, ptr);
	memcpy(handle64, h.reserved, sizeof h.reserved);
	return r;
}

int gtp_ipc_open_mem_handle(uint64_t *ptr, const unsigned char *handle64) {
	if (fp.handle == NULL) return GTP_NOT_LOADED;
	ipc_handle_t h;
	memcpy(h.reserved, handle64, sizeof h.reserved);
	// CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS: enable peer access to the owning
	// device as needed.
	return fp.ipcOpenMemHandle(ptr, h, 0x1);
}

int gtp_ipc_close_mem_handle(uint64_t ptr) {
	if (fp.handle == NULL) return GTP_NOT_LOADED;
	return fp.ipcCloseMemHandle(ptr);
}

int gtp_ctx_get_device(int *dev) {
	if (fp.handle == NULL) return GTP_NOT_LOADED;
	return fp.ctxGetDevice(dev);
}

int gtp_device_can_access_peer(int *can, int dev, int peer) {
	if (fp.handle == NULL) return GTP_NOT_LOADED;
	return fp.deviceCanAccessPeer(can, dev, peer);
}

int gtp_device_by_pci_bus_id(int *dev, const char *id) {
	if (fp.handle == NULL) return GTP_NOT_LOADED;
	return fp.deviceGetByPCIBusId(dev, id);
}

int gtp_ctx_enable_peer_access(uintptr_t peer_ctx) {
	if (fp.handle == NULL) return GTP_NOT_LOADED;
	return fp.ctxEnablePeerAccess((ptr_t)peer_ctx, 0);
}

int gtp_stream_write_value32(uintptr_t stream, uint64_t addr, uint32_t value, unsigned flags) {
	if (fp.handle == NULL) return GTP_NOT_LOADED;
	return fp.streamWriteValue32((ptr_t)stream, addr, value, flags);
}

int gtp_stream_wait_value32(uintptr_t stream, uint64_t addr, uint32_t value, unsigned flags) {
	if (fp.handle == NULL) return GTP_NOT_LOADED;
	return fp.streamWaitValue32((ptr_t)stream, addr, value, flags);
}

int gtp_mem_get_address_range(uint64_t *base, size_t *size, uint64_t ptr) {
	if (fp.handle == NULL) return GTP_NOT_LOADED;
	return fp.memGetAddressRange(base, size, ptr);
}
