// Declarations for the peer part of gotrain's CUDA driver shim
// (peer_shim.c): device memory shared between processes (legacy CUDA IPC),
// peer access, and the stream memory operations that let one GPU's stream
// wait for a flag another GPU writes.

#ifndef GOTRAIN_CUDADRV_PEER_SHIM_H
#define GOTRAIN_CUDADRV_PEER_SHIM_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

int gtp_open(const char *path, char *err, size_t errlen);
int gtp_ipc_get_mem_handle(unsigned char *handle64, uint64_t ptr);
int gtp_ipc_open_mem_handle(uint64_t *ptr, const unsigned char *handle64);
int gtp_ipc_close_mem_handle(uint64_t ptr);
int gtp_ctx_get_device(int *dev);
int gtp_device_can_access_peer(int *can, int dev, int peer);
int gtp_device_by_pci_bus_id(int *dev, const char *id);
int gtp_ctx_enable_peer_access(uintptr_t peer_ctx);
int gtp_stream_write_value32(uintptr_t stream, uint64_t addr, uint32_t value, unsigned flags);
int gtp_stream_wait_value32(uintptr_t stream, uint64_t addr, uint32_t value, unsigned flags);
int gtp_mem_get_address_range(uint64_t *base, size_t *size, uint64_t ptr);

#endif
