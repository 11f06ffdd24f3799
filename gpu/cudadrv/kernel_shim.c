// The module and kernel-launch part of gotrain's CUDA driver shim. It
// resolves its own symbols from the libcuda.so.1 that shim.c opened (dlopen
// of an opened library returns the same handle).

//go:build cgo

#include "kernel_shim.h"
#include "shim.h"

#define GTK_NOT_LOADED (-1)

// CUjit_option values for cuModuleLoadDataEx's error log.
#define CU_JIT_ERROR_LOG_BUFFER 5
#define CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES 6

typedef void *ptr_t;

static struct {
	void *handle;
	int (*moduleLoadDataEx)(ptr_t *, const void *, unsigned, int *, void **);
	int (*moduleGetFunction)(ptr_t *, ptr_t, const char *);
	int (*moduleUnload)(ptr_t);
	int (*launchKernel)(ptr_t, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
			    ptr_t, void **, void **);
} fk;

int gtk_open(const char *path, char *err, size_t errlen) {
	if (fk.handle != NULL) {
		return 0;
	}
	const gtc_sym syms[] = {
		{(void **)&fk.moduleLoadDataEx, "cuModuleLoadDataEx"},
		{(void **)&fk.moduleGetFunction, "cuModuleGetFunction"},
		{(void **)&fk.moduleUnload, "cuModuleUnload"},
		{(void **)&fk.launchKernel, "cuLaunchKernel"},
	};
	fk.handle = gtc_dlopen_syms(path, syms, sizeof syms / sizeof syms[0],
				    "cuModuleLoadDataEx, cuModuleGetFunction, cuModuleUnload or cuLaunchKernel", err, errlen);
	return fk.handle != NULL ? 0 : -1;
}

int gtk_module_load_data(uintptr_t *mod, const char *image, char *log, size_t loglen) {
	if (fk.handle == NULL) return GTK_NOT_LOADED;
	int opts[2] = {CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES};
	void *vals[2] = {log, (void *)(uintptr_t)loglen};
	ptr_t m = NULL;
	int r = fk.moduleLoadDataEx(&m, image, 2, opts, vals);
	*mod = (uintptr_t)m;
	return r;
}

int gtk_module_get_function(uintptr_t *fn, uintptr_t mod, const char *name) {
	if (fk.handle == NULL) return GTK_NOT_LOADED;
	ptr_t f = NULL;
	int r = fk.moduleGetFunction(&f, (ptr_t)mod, name);
	*fn = (uintptr_t)f;
	return r;
}

int gtk_module_unload(uintptr_t mod) {
	if (fk.handle == NULL) return GTK_NOT_LOADED;
	return fk.moduleUnload((ptr_t)mod);
}

int gtk_launch_kernel(uintptr_t fn, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
		      unsigned bz, unsigned shared, uintptr_t stream, void *args, const size_t *offsets,
		      int nargs) {
	if (fk.handle == NULL) return GTK_NOT_LOADED;
	void *params[32];
	if (nargs < 0 || nargs > 32) return 1; /* CUDA_ERROR_INVALID_VALUE */
	for (int i = 0; i < nargs; i++) {
		params[i] = (char *)args + offsets[i];
	}
	return fk.launchKernel((ptr_t)fn, gx, gy, gz, bx, by, bz, shared, (ptr_t)stream, params, NULL);
}
