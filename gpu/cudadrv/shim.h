// Declarations for gotrain's CUDA driver shim: gotrain's own declarations of
// the few driver entry points it uses. No cuda.h is needed to build; libcuda
// is dlopened at run time and every call goes through a dlsym'd pointer.

#ifndef GOTRAIN_CUDADRV_SHIM_H
#define GOTRAIN_CUDADRV_SHIM_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#define GTC_NOT_LOADED (-1) /* returned by every call before gtc_open succeeds */

int gtc_open(const char *path, char *err, size_t errlen);

// For the other parts of the shim (kernel_shim.c, stream_shim.c), which
// resolve their own symbols from the library gtc_open opened.

// gtc_sym is one symbol to resolve and the function-pointer field it goes to.
typedef struct {
	void **slot;
	const char *name;
} gtc_sym;

// gtc_dlopen dlopens path, or writes the loader's reason into err and
// returns NULL.
void *gtc_dlopen(const char *path, char *err, size_t errlen);

// gtc_dlopen_syms dlopens path and resolves the n syms into their slots. When
// one is missing it writes "<path> lacks <lacks>" into err, clears the slots,
// closes the library and returns NULL.
void *gtc_dlopen_syms(const char *path, const gtc_sym *syms, int n, const char *lacks, char *err,
		      size_t errlen);

int gtc_init(unsigned int flags);
int gtc_driver_get_version(int *v);
int gtc_get_error_name(int res, const char **s);
int gtc_get_error_string(int res, const char **s);

int gtc_device_get_count(int *n);
int gtc_device_get(int *dev, int ordinal);
int gtc_device_get_name(char *name, int len, int dev);
int gtc_device_get_pci_bus_id(char *id, int len, int dev);
int gtc_device_get_attribute(int *v, int attr, int dev);
int gtc_device_total_mem(size_t *bytes, int dev);

int gtc_primary_ctx_retain(uintptr_t *ctx, int dev);
int gtc_primary_ctx_release(int dev);
int gtc_ctx_set_current(uintptr_t ctx);
int gtc_ctx_get_current(uintptr_t *ctx);
int gtc_ctx_synchronize(void);

int gtc_mem_alloc(uint64_t *ptr, size_t bytes);
int gtc_mem_free(uint64_t ptr);
int gtc_memset_d8(uint64_t ptr, unsigned char v, size_t n);
int gtc_memset_d32(uint64_t ptr, unsigned int v, size_t n);
int gtc_memset_d8_async(uint64_t ptr, unsigned char v, size_t n, uintptr_t stream);
int gtc_memset_d32_async(uint64_t ptr, unsigned int v, size_t n, uintptr_t stream);
int gtc_memcpy_htod(uint64_t dst, const void *src, size_t bytes);
int gtc_memcpy_dtoh(void *dst, uint64_t src, size_t bytes);
int gtc_memcpy_dtod(uint64_t dst, uint64_t src, size_t bytes);
int gtc_memcpy_htod_async(uint64_t dst, const void *src, size_t bytes, uintptr_t stream);
int gtc_memcpy_dtoh_async(void *dst, uint64_t src, size_t bytes, uintptr_t stream);

int gtc_stream_create(uintptr_t *stream, unsigned int flags);
int gtc_stream_synchronize(uintptr_t stream);
int gtc_stream_query(uintptr_t stream);
int gtc_stream_destroy(uintptr_t stream);

int gtc_event_create(uintptr_t *event, unsigned int flags);
int gtc_event_record(uintptr_t event, uintptr_t stream);
int gtc_event_query(uintptr_t event);
int gtc_event_synchronize(uintptr_t event);
int gtc_event_elapsed_time(float *ms, uintptr_t start, uintptr_t end);
int gtc_event_destroy(uintptr_t event);

#endif
