//go:build cgo

package cublas

/*
#cgo LDFLAGS: -ldl
#include "shim.h"
*/
import "C"

import "unsafe"

func cOpen(path string) string {
	cpath := C.CString(path)
	defer C.free(unsafe.Pointer(cpath))
	var buf [1024]C.char
	if C.gtb_open(cpath, &buf[0], C.size_t(len(buf))) != 0 {
		return C.GoString(&buf[0])
	}
	return ""
}

func cGetVersion(h uintptr) (int, int) {
	var v C.int
	r := C.gtb_get_version(C.uintptr_t(h), &v)
	return int(v), int(r)
}

func cCreate() (uintptr, int) {
	var h C.uintptr_t
	r := C.gtb_create(&h)
	return uintptr(h), int(r)
}

func cDestroy(h uintptr) int { return int(C.gtb_destroy(C.uintptr_t(h))) }

func cSetStream(h, s uintptr) int { return int(C.gtb_set_stream(C.uintptr_t(h), C.uintptr_t(s))) }

func cSetMathMode(h uintptr, mode int) int {
	return int(C.gtb_set_math_mode(C.uintptr_t(h), C.int(mode)))
}

func cSetSmCountTarget(h uintptr, n int) int {
	return int(C.gtb_set_sm_count_target(C.uintptr_t(h), C.int(n)))
}

func cSgemm(h uintptr, ta, tb Op, m, n, k int, alpha float32, a uintptr, lda int, b uintptr, ldb int, beta float32, c uintptr, ldc int) int {
	return int(C.gtb_sgemm(C.uintptr_t(h), C.int(ta), C.int(tb), C.int(m), C.int(n), C.int(k), C.float(alpha),
		C.uint64_t(a), C.int(lda), C.uint64_t(b), C.int(ldb), C.float(beta), C.uint64_t(c), C.int(ldc)))
}

func cGemmEx(h uintptr, ta, tb Op, m, n, k int, alpha float32, a uintptr, at DataType, lda int, b uintptr, bt DataType, ldb int, beta float32, c uintptr, ct DataType, ldc int, compute ComputeType) int {
	return int(C.gtb_gemm_ex(C.uintptr_t(h), C.int(ta), C.int(tb), C.int(m), C.int(n), C.int(k), C.float(alpha),
		C.uint64_t(a), C.int(at), C.int(lda), C.uint64_t(b), C.int(bt), C.int(ldb), C.float(beta),
		C.uint64_t(c), C.int(ct), C.int(ldc), C.int(compute), C.int(gemmDefault)))
}
