// Declarations for the module and kernel-launch part of gotrain's CUDA
// driver shim (kernel_shim.c): load PTX, find a kernel, launch it.

#ifndef GOTRAIN_CUDADRV_KERNEL_SHIM_H
#define GOTRAIN_CUDADRV_KERNEL_SHIM_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

int gtk_open(const char *path, char *err, size_t errlen);
int gtk_module_load_data(uintptr_t *mod, const char *image, char *log, size_t loglen);
int gtk_module_get_function(uintptr_t *fn, uintptr_t mod, const char *name);
int gtk_module_unload(uintptr_t mod);
// gtk_launch_kernel launches fn with nargs parameters; parameter i lies at
// args + offsets[i] (C memory).
int gtk_launch_kernel(uintptr_t fn, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
		      unsigned bz, unsigned shared, uintptr_t stream, void *args, const size_t *offsets,
		      int nargs);

#endif
