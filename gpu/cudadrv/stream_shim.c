// The stream-ordering part of gotrain's CUDA driver shim. Like kernel_shim.c
// it resolves its own symbols from the libcuda.so.1 that shim.c opened.

//go:build cgo

#include "shim.h"
#include "stream_shim.h"

#define GTS_NOT_LOADED (-1)

typedef void *ptr_t;

static struct {
	void *handle;
	int (*streamWaitEvent)(ptr_t, ptr_t, unsigned);
	int (*memcpyDtoDAsync)(uint64_t, uint64_t, size_t, ptr_t);
	int (*streamCreateWithPriority)(ptr_t *, unsigned, int);
	int (*ctxGetStreamPriorityRange)(int *, int *);
} fs;

int gts_open(const char *path, char *err, size_t errlen) {
	if (fs.handle != NULL) {
		return 0;
	}
	const gtc_sym syms[] = {
		{(void **)&fs.streamWaitEvent, "cuStreamWaitEvent"},
		{(void **)&fs.memcpyDtoDAsync, "cuMemcpyDtoDAsync_v2"},
		{(void **)&fs.streamCreateWithPriority, "cuStreamCreateWithPriority"},
		{(void **)&fs.ctxGetStreamPriorityRange, "cuCtxGetStreamPriorityRange"},
	};
	fs.handle = gtc_dlopen_syms(path, syms, sizeof syms / sizeof syms[0],
				    "cuStreamWaitEvent, cuMemcpyDtoDAsync_v2, cuStreamCreateWithPriority or cuCtxGetStreamPriorityRange",
				    err, errlen);
	return fs.handle != NULL ? 0 : -1;
}

int gts_stream_wait_event(uintptr_t stream, uintptr_t event) {
	if (fs.handle == NULL) return GTS_NOT_LOADED;
	return fs.streamWaitEvent((ptr_t)stream, (ptr_t)event, 0);
}

int gts_memcpy_dtod_async(uint64_t dst, uint64_t src, size_t bytes, uintptr_t stream) {
	if (fs.handle == NULL) return GTS_NOT_LOADED;
	return fs.memcpyDtoDAsync(dst, src, bytes, (ptr_t)stream);
}

int gts_stream_create_with_priority(uintptr_t *stream, unsigned flags, int priority) {
	if (fs.handle == NULL) return GTS_NOT_LOADED;
	ptr_t s = NULL;
	int r = fs.streamCreateWithPriority(&s, flags, priority);
	*stream = (uintptr_t)s;
	return r;
}

int gts_ctx_stream_priority_range(int *least, int *greatest) {
	if (fs.handle == NULL) return GTS_NOT_LOADED;
	return fs.ctxGetStreamPriorityRange(least, greatest);
}
