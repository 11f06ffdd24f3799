//go:build cgo

package cudadrv

// cgo calls of the stream-ordering part (stream_shim.c).

/*
#cgo LDFLAGS: -ldl
#include "stream_shim.h"
*/
import "C"

import "unsafe"

func cStreamOpen(path string) string {
	cpath := C.CString(path)
	defer C.free(unsafe.Pointer(cpath))
	var buf [1024]C.char
	if C.gts_open(cpath, &buf[0], C.size_t(len(buf))) != 0 {
		return C.GoString(&buf[0])
	}
	return ""
}

func cStreamWaitEvent(s Stream, e Event) int {
	return int(C.gts_stream_wait_event(C.uintptr_t(s), C.uintptr_t(e)))
}

func cMemcpyDtoDAsync(dst, src DevicePtr, bytes int, s Stream) int {
	return int(C.gts_memcpy_dtod_async(C.uint64_t(dst), C.uint64_t(src), C.size_t(bytes), C.uintptr_t(s)))
}

func cStreamCreateWithPriority(flags uint32, priority int) (Stream, int) {
	var s C.uintptr_t
	r := C.gts_stream_create_with_priority(&s, C.uint(flags), C.int(priority))
	return Stream(s), int(r)
}

func cStreamPriorityRange() (least, greatest, r int) {
	var l, g C.int
	r = int(C.gts_ctx_stream_priority_range(&l, &g))
	return int(l), int(g), r
}
