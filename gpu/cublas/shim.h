// gotrain's cuBLAS shim: dlopen libcublas and call it through function
// pointers, with our own declarations of the few entry points used (no
// cuBLAS headers at build time). Every call returns a cublasStatus_t, or
// GTB_NOT_LOADED before gtb_open succeeded, or GTB_MISSING when an optional
// entry point is not in the loaded library.

#ifndef GOTRAIN_CUBLAS_SHIM_H
#define GOTRAIN_CUBLAS_SHIM_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#define GTB_NOT_LOADED (-1)
#define GTB_MISSING (-2)

int gtb_open(const char *path, char *err, size_t errlen);
int gtb_get_version(uintptr_t h, int *v);
int gtb_create(uintptr_t *h);
int gtb_destroy(uintptr_t h);
int gtb_set_stream(uintptr_t h, uintptr_t stream);
int gtb_set_math_mode(uintptr_t h, int mode);
int gtb_set_sm_count_target(uintptr_t h, int n);
int gtb_sgemm(uintptr_t h, int ta, int tb, int m, int n, int k, float alpha, uint64_t a, int lda,
	      uint64_t b, int ldb, float beta, uint64_t c, int ldc);
int gtb_gemm_ex(uintptr_t h, int ta, int tb, int m, int n, int k, float alpha, uint64_t a, int atype,
		int lda, uint64_t b, int btype, int ldb, float beta, uint64_t c, int ctype, int ldc,
		int compute, int algo);

#endif
