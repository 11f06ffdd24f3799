//go:build cgo

package cudadrv

// cgo calls of the host-memory part (hostmem_shim.c).

/*
#cgo LDFLAGS: -ldl
#include "hostmem_shim.h"
*/
import "C"

import "unsafe"

func cHostOpen(path string) string {
	cpath := C.CString(path)
	defer C.free(unsafe.Pointer(cpath))
	var buf [1024]C.char
	if C.gth_open(cpath, &buf[0], C.size_t(len(buf))) != 0 {
		return C.GoString(&buf[0])
	}
	return ""
}

func cMemHostRegister(p unsafe.Pointer, bytes int, flags uint32) int {
	return int(C.gth_mem_host_register(p, C.size_t(bytes), C.uint(flags)))
}

func cMemHostUnregister(p unsafe.Pointer) int { return int(C.gth_mem_host_unregister(p)) }
