// Declarations for the stream-ordering part of gotrain's CUDA driver shim
// (stream_shim.c): cross-stream waits, device-to-device copies on a stream,
// stream priorities.

#ifndef GOTRAIN_CUDADRV_STREAM_SHIM_H
#define GOTRAIN_CUDADRV_STREAM_SHIM_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

int gts_open(const char *path, char *err, size_t errlen);
int gts_stream_wait_event(uintptr_t stream, uintptr_t event);
int gts_memcpy_dtod_async(uint64_t dst, uint64_t src, size_t bytes, uintptr_t stream);
int gts_stream_create_with_priority(uintptr_t *stream, unsigned flags, int priority);
int gts_ctx_stream_priority_range(int *least, int *greatest);

#endif
