// Declarations for the host-memory part of gotrain's CUDA driver shim
// (hostmem_shim.c): page-locking memory the program already has (a
// snapshot's memfd mapping) so that copies to and from the device run at
// the link's rate, with no staging copy.

#ifndef GOTRAIN_CUDADRV_HOSTMEM_SHIM_H
#define GOTRAIN_CUDADRV_HOSTMEM_SHIM_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

int gth_open(const char *path, char *err, size_t errlen);
int gth_mem_host_register(void *p, size_t bytes, unsigned flags);
int gth_mem_host_unregister(void *p);

#endif
