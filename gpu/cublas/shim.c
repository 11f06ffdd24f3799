// gotrain's cuBLAS shim (see shim.h).

//go:build cgo

#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#include "shim.h"

typedef void *ptr_t;

static struct {
	void *handle;
	int (*getVersion)(ptr_t, int *);
	int (*create)(ptr_t *);
	int (*destroy)(ptr_t);
	int (*setStream)(ptr_t, ptr_t);
	int (*setMathMode)(ptr_t, int);
	int (*setSmCountTarget)(ptr_t, int); /* cuBLAS 11.3+; NULL in older ones */
	int (*sgemm)(ptr_t, int, int, int, int, int, const float *, const void *, int, const void *,
		     int, const float *, void *, int);
	int (*gemmEx)(ptr_t, int, int, int, int, int, const void *, const void *, int, int,
		      const void *, int, int, const void *, void *, int, int, int, int);
} fb;

int gtb_open(const char *path, char *err, size_t errlen) {
	if (fb.handle != NULL) {
		return 0;
	}
	void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (h == NULL) {
		const char *e = dlerror();
		snprintf(err, errlen, "%s", e != NULL ? e : "dlopen failed");
		return -1;
	}
	*(void **)(&fb.getVersion) = dlsym(h, "cublasGetVersion_v2");
	*(void **)(&fb.create) = dlsym(h, "cublasCreate_v2");
	*(void **)(&fb.destroy) = dlsym(h, "cublasDestroy_v2");
	*(void **)(&fb.setStream) = dlsym(h, "cublasSetStream_v2");
	*(void **)(&fb.setMathMode) = dlsym(h, "cublasSetMathMode");
	*(void **)(&fb.sgemm) = dlsym(h, "cublasSgemm_v2");
	*(void **)(&fb.gemmEx) = dlsym(h, "cublasGemmEx");
	*(void **)(&fb.setSmCountTarget) = dlsym(h, "cublasSetSmCountTarget"); /* optional */
	if (fb.getVersion == NULL || fb.create == NULL || fb.destroy == NULL || fb.setStream == NULL ||
	    fb.setMathMode == NULL || fb.sgemm == NULL || fb.gemmEx == NULL) {
		snprintf(err, errlen, "%s lacks one of cublasCreate_v2, cublasSetMathMode, cublasSgemm_v2, cublasGemmEx (cuBLAS 11 or newer needed)", path);
		memset(&fb, 0, sizeof fb);
		dlclose(h);
		return -1;
	}
	fb.handle = h;
	return 0;
}

int gtb_get_version(uintptr_t h, int *v) {
	if (fb.handle == NULL) return GTB_NOT_LOADED;
	return fb.getVersion((ptr_t)h, v);
}

int gtb_create(uintptr_t *h) {
	if (fb.handle == NULL) return GTB_NOT_LOADED;
	ptr_t p = NULL;
	int r = fb.create(&p);
	*h = (uintptr_t)p;
	return r;
}

int gtb_destroy(uintptr_t h) {
	if (fb.handle == NULL) return GTB_NOT_LOADED;
	return fb.destroy((ptr_t)h);
}

int gtb_set_stream(uintptr_t h, uintptr_t stream) {
	if (fb.handle == NULL) return GTB_NOT_LOADED;
	return fb.setStream((ptr_t)h, (ptr_t)stream);
}

int gtb_set_math_mode(uintptr_t h, int mode) {
	if (fb.handle == NULL) return GTB_NOT_LOADED;
	return fb.setMathMode((ptr_t)h, mode);
}

int gtb_set_sm_count_target(uintptr_t h, int n) {
	if (fb.handle == NULL) return GTB_NOT_LOADED;
	if (fb.setSmCountTarget == NULL) return GTB_MISSING;
	return fb.setSmCountTarget((ptr_t)h, n);
}

int gtb_sgemm(uintptr_t h, int ta, int tb, int m, int n, int k, float alpha, uint64_t a, int lda,
	      uint64_t b, int ldb, float beta, uint64_t c, int ldc) {
	if (fb.handle == NULL) return GTB_NOT_LOADED;
	return fb.sgemm((ptr_t)h, ta, tb, m, n, k, &alpha, (const void *)(uintptr_t)a, lda,
			(const void *)(uintptr_t)b, ldb, &beta, (void *)(uintptr_t)c, ldc);
}

int gtb_gemm_ex(uintptr_t h, int ta, int tb, int m, int n, int k, float alpha, uint64_t a, int atype,
		int lda, uint64_t b, int btype, int ldb, float beta, uint64_t c, int ctype, int ldc,
		int compute, int algo) {
	if (fb.handle == NULL) return GTB_NOT_LOADED;
	return fb.gemmEx((ptr_t)h, ta, tb, m, n, k, &alpha, (const void *)(uintptr_t)a, atype, lda,
			 (const void *)(uintptr_t)b, btype, ldb, &beta, (void *)(uintptr_t)c, ctype, ldc,
			 compute, algo);
}
