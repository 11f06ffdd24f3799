// gotrain's CUDA driver shim: dlopen libcuda.so.1 and call through dlsym'd
// pointers. CUresult is an int, CUdevice an int, CUdeviceptr a 64-bit
// integer, and contexts, streams and events are opaque pointers.

//go:build cgo

#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#include "shim.h"

typedef void *ptr_t;

static struct {
	void *handle;
	int (*init)(unsigned int);
	int (*driverGetVersion)(int *);
	int (*getErrorName)(int, const char **);
	int (*getErrorString)(int, const char **);
	int (*deviceGetCount)(int *);
	int (*deviceGet)(int *, int);
	int (*deviceGetName)(char *, int, int);
	int (*deviceGetPCIBusId)(char *, int, int);
	int (*deviceGetAttribute)(int *, int, int);
	int (*deviceTotalMem)(size_t *, int);
	int (*primaryCtxRetain)(ptr_t *, int);
	int (*primaryCtxRelease)(int);
	int (*ctxSetCurrent)(ptr_t);
	int (*ctxGetCurrent)(ptr_t *);
	int (*ctxSynchronize)(void);
	int (*memAlloc)(uint64_t *, size_t);
	int (*memFree)(uint64_t);
	int (*memsetD8)(uint64_t, unsigned char, size_t);
	int (*memsetD32)(uint64_t, unsigned int, size_t);
	int (*memsetD8Async)(uint64_t, unsigned char, size_t, ptr_t);
	int (*memsetD32Async)(uint64_t, unsigned int, size_t, ptr_t);
	int (*memcpyHtoD)(uint64_t, const void *, size_t);
	int (*memcpyDtoH)(void *, uint64_t, size_t);
	int (*memcpyDtoD)(uint64_t, uint64_t, size_t);
	int (*memcpyHtoDAsync)(uint64_t, const void *, size_t, ptr_t);
	int (*memcpyDtoHAsync)(void *, uint64_t, size_t, ptr_t);
	int (*streamCreate)(ptr_t *, unsigned int);
	int (*streamSynchronize)(ptr_t);
	int (*streamQuery)(ptr_t);
	int (*streamDestroy)(ptr_t);
	int (*eventCreate)(ptr_t *, unsigned int);
	int (*eventRecord)(ptr_t, ptr_t);
	int (*eventQuery)(ptr_t);
	int (*eventSynchronize)(ptr_t);
	int (*eventElapsedTime)(float *, ptr_t, ptr_t);
	int (*eventDestroy)(ptr_t);
} fn;

// sym resolves the versioned name (the one cuda.h maps the plain name to)
// when the driver has it, else the plain name.
static void *sym(void *h, const char *plain, const char *versioned) {
	void *p = versioned != NULL ? dlsym(h, versioned) : NULL;
	return p != NULL ? p : dlsym(h, plain);
}

void *gtc_dlopen(const char *path, char *err, size_t errlen) {
	void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (h == NULL) {
		const char *e = dlerror();
		snprintf(err, errlen, "%s", e != NULL ? e : "dlopen failed");
	}
	return h;
}

void *gtc_dlopen_syms(const char *path, const gtc_sym *syms, int n, const char *lacks, char *err,
		      size_t errlen) {
	void *h = gtc_dlopen(path, err, errlen);
	if (h == NULL) {
		return NULL;
	}
	for (int i = 0; i < n; i++) {
		*syms[i].slot = dlsym(h, syms[i].name);
		if (*syms[i].slot == NULL) {
			snprintf(err, errlen, "%s lacks %s", path, lacks);
			for (int j = 0; j < n; j++) {
				*syms[j].slot = NULL;
			}
			dlclose(h);
			return NULL;
		}
	}
	return h;
}

#define RESOLVE(field, plain, versioned)                                        \
	do {                                                                    \
		*(void **)(&fn.field) = sym(h, plain, versioned);               \
		if (fn.field == NULL) {                                         \
			snprintf(err, errlen, "%s has no symbol %s", path, plain); \
			goto fail;                                              \
		}                                                               \
	} while (0)

int gtc_open(const char *path, char *err, size_t errlen) {
	if (fn.handle != NULL) {
		return 0;
	}
	void *h = gtc_dlopen(path, err, errlen);
	if (h == NULL) {
		return -1;
	}
	RESOLVE(init, "cuInit", NULL);
	RESOLVE(driverGetVersion, "cuDriverGetVersion", NULL);
	RESOLVE(getErrorName, "cuGetErrorName", NULL);
	RESOLVE(getErrorString, "cuGetErrorString", NULL);
	RESOLVE(deviceGetCount, "cuDeviceGetCount", NULL);
	RESOLVE(deviceGet, "cuDeviceGet", NULL);
	RESOLVE(deviceGetName, "cuDeviceGetName", NULL);
	RESOLVE(deviceGetPCIBusId, "cuDeviceGetPCIBusId", NULL);
	RESOLVE(deviceGetAttribute, "cuDeviceGetAttribute", NULL);
	RESOLVE(deviceTotalMem, "cuDeviceTotalMem", "cuDeviceTotalMem_v2");
	RESOLVE(primaryCtxRetain, "cuDevicePrimaryCtxRetain", NULL);
	RESOLVE(primaryCtxRelease, "cuDevicePrimaryCtxRelease", "cuDevicePrimaryCtxRelease_v2");
	RESOLVE(ctxSetCurrent, "cuCtxSetCurrent", NULL);
	RESOLVE(ctxGetCurrent, "cuCtxGetCurrent", NULL);
	RESOLVE(ctxSynchronize, "cuCtxSynchronize", NULL);
	RESOLVE(memAlloc, "cuMemAlloc", "cuMemAlloc_v2");
	RESOLVE(memFree, "cuMemFree", "cuMemFree_v2");
	RESOLVE(memsetD8, "cuMemsetD8", "cuMemsetD8_v2");
	RESOLVE(memsetD32, "cuMemsetD32", "cuMemsetD32_v2");
	RESOLVE(memsetD8Async, "cuMemsetD8Async", NULL);
	RESOLVE(memsetD32Async, "cuMemsetD32Async", NULL);
	RESOLVE(memcpyHtoD, "cuMemcpyHtoD", "cuMemcpyHtoD_v2");
	RESOLVE(memcpyDtoH, "cuMemcpyDtoH", "cuMemcpyDtoH_v2");
	RESOLVE(memcpyDtoD, "cuMemcpyDtoD", "cuMemcpyDtoD_v2");
	RESOLVE(memcpyHtoDAsync, "cuMemcpyHtoDAsync", "cuMemcpyHtoDAsync_v2");
	RESOLVE(memcpyDtoHAsync, "cuMemcpyDtoHAsync", "cuMemcpyDtoHAsync_v2");
	RESOLVE(streamCreate, "cuStreamCreate", NULL);
	RESOLVE(streamSynchronize, "cuStreamSynchronize", NULL);
	RESOLVE(streamQuery, "cuStreamQuery", NULL);
	RESOLVE(streamDestroy, "cuStreamDestroy", "cuStreamDestroy_v2");
	RESOLVE(eventCreate, "cuEventCreate", NULL);
	RESOLVE(eventRecord, "cuEventRecord", NULL);
	RESOLVE(eventQuery, "cuEventQuery", NULL);
	RESOLVE(eventSynchronize, "cuEventSynchronize", NULL);
	RESOLVE(eventElapsedTime, "cuEventElapsedTime", NULL);
	RESOLVE(eventDestroy, "cuEventDestroy", "cuEventDestroy_v2");
	fn.handle = h;
	return 0;
fail:
	memset(&fn, 0, sizeof fn);
	dlclose(h);
	return -1;
}

#define LOADED(call) return fn.handle != NULL ? (call) : GTC_NOT_LOADED

int gtc_init(unsigned int flags) { LOADED(fn.init(flags)); }
int gtc_driver_get_version(int *v) { LOADED(fn.driverGetVersion(v)); }
int gtc_get_error_name(int res, const char **s) { LOADED(fn.getErrorName(res, s)); }
int gtc_get_error_string(int res, const char **s) { LOADED(fn.getErrorString(res, s)); }

int gtc_device_get_count(int *n) { LOADED(fn.deviceGetCount(n)); }
int gtc_device_get(int *dev, int ordinal) { LOADED(fn.deviceGet(dev, ordinal)); }
int gtc_device_get_name(char *name, int len, int dev) { LOADED(fn.deviceGetName(name, len, dev)); }
int gtc_device_get_pci_bus_id(char *id, int len, int dev) { LOADED(fn.deviceGetPCIBusId(id, len, dev)); }
int gtc_device_get_attribute(int *v, int attr, int dev) { LOADED(fn.deviceGetAttribute(v, attr, dev)); }
int gtc_device_total_mem(size_t *bytes, int dev) { LOADED(fn.deviceTotalMem(bytes, dev)); }

int gtc_primary_ctx_retain(uintptr_t *ctx, int dev) {
	if (fn.handle == NULL) return GTC_NOT_LOADED;
	ptr_t c = NULL;
	int r = fn.primaryCtxRetain(&c, dev);
	*ctx = (uintptr_t)c;
	return r;
}
int gtc_primary_ctx_release(int dev) { LOADED(fn.primaryCtxRelease(dev)); }
int gtc_ctx_set_current(uintptr_t ctx) { LOADED(fn.ctxSetCurrent((ptr_t)ctx)); }
int gtc_ctx_get_current(uintptr_t *ctx) {
	if (fn.handle == NULL) return GTC_NOT_LOADED;
	ptr_t c = NULL;
	int r = fn.ctxGetCurrent(&c);
	*ctx = (uintptr_t)c;
	return r;
}
int gtc_ctx_synchronize(void) { LOADED(fn.ctxSynchronize()); }

int gtc_mem_alloc(uint64_t *ptr, size_t bytes) { LOADED(fn.memAlloc(ptr, bytes)); }
int gtc_mem_free(uint64_t ptr) { LOADED(fn.memFree(ptr)); }
int gtc_memset_d8(uint64_t ptr, unsigned char v, size_t n) { LOADED(fn.memsetD8(ptr, v, n)); }
int gtc_memset_d32(uint64_t ptr, unsigned int v, size_t n) { LOADED(fn.memsetD32(ptr, v, n)); }
int gtc_memset_d8_async(uint64_t ptr, unsigned char v, size_t n, uintptr_t s) { LOADED(fn.memsetD8Async(ptr, v, n, (ptr_t)s)); }
int gtc_memset_d32_async(uint64_t ptr, unsigned int v, size_t n, uintptr_t s) { LOADED(fn.memsetD32Async(ptr, v, n, (ptr_t)s)); }
int gtc_memcpy_htod(uint64_t dst, const void *src, size_t bytes) { LOADED(fn.memcpyHtoD(dst, src, bytes)); }
int gtc_memcpy_dtoh(void *dst, uint64_t src, size_t bytes) { LOADED(fn.memcpyDtoH(dst, src, bytes)); }
int gtc_memcpy_dtod(uint64_t dst, uint64_t src, size_t bytes) { LOADED(fn.memcpyDtoD(dst, src, bytes)); }
int gtc_memcpy_htod_async(uint64_t dst, const void *src, size_t bytes, uintptr_t s) { LOADED(fn.memcpyHtoDAsync(dst, src, bytes, (ptr_t)s)); }
int gtc_memcpy_dtoh_async(void *dst, uint64_t src, size_t bytes, uintptr_t s) { LOADED(fn.memcpyDtoHAsync(dst, src, bytes, (ptr_t)s)); }

int gtc_stream_create(uintptr_t *stream, unsigned int flags) {
	if (fn.handle == NULL) return GTC_NOT_LOADED;
	ptr_t s = NULL;
	int r = fn.streamCreate(&s, flags);
	*stream = (uintptr_t)s;
	return r;
}
int gtc_stream_synchronize(uintptr_t s) { LOADED(fn.streamSynchronize((ptr_t)s)); }
int gtc_stream_query(uintptr_t s) { LOADED(fn.streamQuery((ptr_t)s)); }
int gtc_stream_destroy(uintptr_t s) { LOADED(fn.streamDestroy((ptr_t)s)); }

int gtc_event_create(uintptr_t *event, unsigned int flags) {
	if (fn.handle == NULL) return GTC_NOT_LOADED;
	ptr_t e = NULL;
	int r = fn.eventCreate(&e, flags);
	*event = (uintptr_t)e;
	return r;
}
int gtc_event_record(uintptr_t e, uintptr_t s) { LOADED(fn.eventRecord((ptr_t)e, (ptr_t)s)); }
int gtc_event_query(uintptr_t e) { LOADED(fn.eventQuery((ptr_t)e)); }
int gtc_event_synchronize(uintptr_t e) { LOADED(fn.eventSynchronize((ptr_t)e)); }
int gtc_event_elapsed_time(float *ms, uintptr_t start, uintptr_t end) { LOADED(fn.eventElapsedTime(ms, (ptr_t)start, (ptr_t)end)); }
int gtc_event_destroy(uintptr_t e) { LOADED(fn.eventDestroy((ptr_t)e)); }
