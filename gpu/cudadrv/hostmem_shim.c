// The host-memory part of gotrain's CUDA driver shim. Like peer_shim.c it
// resolves its own symbols from the libcuda.so.1 that shim.c opened.

//go:build cgo

#include "shim.h"
#include "hostmem_shim.h"

#define GTH_NOT_LOADED (-1)

static struct {
	void *handle;
	int (*memHostRegister)(void *, size_t, unsigned);
	int (*memHostUnregister)(void *);
} fh;

int gth_open(const char *path, char *err, size_t errlen) {
	if (fh.handle != NULL) {
		return 0;
	}
	// cuMemHostRegister_v2 is the name cuda.h maps the call to since CUDA 6.5.
	const gtc_sym syms[] = {
		{(void **)&fh.memHostRegister, "cuMemHostRegister_v2"},
		{(void **)&fh.memHostUnregister, "cuMemHostUnregister"},
	};
	fh.handle = gtc_dlopen_syms(path, syms, sizeof syms / sizeof syms[0], "cuMemHostRegister (a driver for CUDA 6.5 or newer)",
				    err, errlen);
	return fh.handle != NULL ? 0 : -1;
}

int gth_mem_host_register(void *p, size_t bytes, unsigned flags) {
	if (fh.handle == NULL) return GTH_NOT_LOADED;
	return fh.memHostRegister(p, bytes, flags);
}

int gth_mem_host_unregister(void *p) {
	if (fh.handle == NULL) return GTH_NOT_LOADED;
	return fh.memHostUnregister(p);
}
