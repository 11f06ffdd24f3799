//go:build cgo

package cudadrv

// The only file with cgo calls: each function is one call into shim.c. A
// result of notLoaded (-1) means Load has not opened the driver.

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
	if C.gtc_open(cpath, &buf[0], C.size_t(len(buf))) != 0 {
		return C.GoString(&buf[0])
	}
	return ""
}

func cInit() int { return int(C.gtc_init(0)) }

func cDriverVersion() (int, int) {
	var v C.int
	r := C.gtc_driver_get_version(&v)
	return int(v), int(r)
}

func cErrorName(res int) string {
	var s *C.char
	if C.gtc_get_error_name(C.int(res), &s) != 0 || s == nil {
		return ""
	}
	return C.GoString(s)
}

func cErrorString(res int) string {
	var s *C.char
	if C.gtc_get_error_string(C.int(res), &s) != 0 || s == nil {
		return ""
	}
	return C.GoString(s)
}

func cDeviceCount() (int, int) {
	var n C.int
	r := C.gtc_device_get_count(&n)
	return int(n), int(r)
}

func cDeviceGet(ordinal int) (Device, int) {
	var d C.int
	r := C.gtc_device_get(&d, C.int(ordinal))
	return Device(d), int(r)
}

func cDeviceName(dev Device) (string, int) {
	var buf [256]C.char
	r := C.gtc_device_get_name(&buf[0], C.int(len(buf)), C.int(dev))
	return C.GoString(&buf[0]), int(r)
}

func cDevicePCIBusID(dev Device) (string, int) {
	var buf [64]C.char
	r := C.gtc_device_get_pci_bus_id(&buf[0], C.int(len(buf)), C.int(dev))
	return C.GoString(&buf[0]), int(r)
}

func cDeviceAttribute(attr int, dev Device) (int, int) {
	var v C.int
	r := C.gtc_device_get_attribute(&v, C.int(attr), C.int(dev))
	return int(v), int(r)
}

func cDeviceTotalMem(dev Device) (uint64, int) {
	var n C.size_t
	r := C.gtc_device_total_mem(&n, C.int(dev))
	return uint64(n), int(r)
}

func cPrimaryCtxRetain(dev Device) (Context, int) {
	var c C.uintptr_t
	r := C.gtc_primary_ctx_retain(&c, C.int(dev))
	return Context(c), int(r)
}

func cPrimaryCtxRelease(dev Device) int { return int(C.gtc_primary_ctx_release(C.int(dev))) }
func cCtxSetCurrent(c Context) int      { return int(C.gtc_ctx_set_current(C.uintptr_t(c))) }

func cCtxGetCurrent() (Context, int) {
	var c C.uintptr_t
	r := C.gtc_ctx_get_current(&c)
	return Context(c), int(r)
}

func cCtxSynchronize() int { return int(C.gtc_ctx_synchronize()) }

func cMemAlloc(bytes int) (DevicePtr, int) {
	var p C.uint64_t
	r := C.gtc_mem_alloc(&p, C.size_t(bytes))
	return DevicePtr(p), int(r)
}

func cMemFree(p DevicePtr) int { return int(C.gtc_mem_free(C.uint64_t(p))) }

func cMemsetD8(p DevicePtr, v uint8, n int) int {
	return int(C.gtc_memset_d8(C.uint64_t(p), C.uchar(v), C.size_t(n)))
}

func cMemsetD32(p DevicePtr, v uint32, n int) int {
	return int(C.gtc_memset_d32(C.uint64_t(p), C.uint(v), C.size_t(n)))
}

func cMemsetD8Async(p DevicePtr, v uint8, n int, s Stream) int {
	return int(C.gtc_memset_d8_async(C.uint64_t(p), C.uchar(v), C.size_t(n), C.uintptr_t(s)))
}

func cMemsetD32Async(p DevicePtr, v uint32, n int, s Stream) int {
	return int(C.gtc_memset_d32_async(C.uint64_t(p), C.uint(v), C.size_t(n), C.uintptr_t(s)))
}

func cMemcpyHtoD(dst DevicePtr, src unsafe.Pointer, bytes int) int {
	return int(C.gtc_memcpy_htod(C.uint64_t(dst), src, C.size_t(bytes)))
}

func cMemcpyDtoH(dst unsafe.Pointer, src DevicePtr, bytes int) int {
	return int(C.gtc_memcpy_dtoh(dst, C.uint64_t(src), C.size_t(bytes)))
}

func cMemcpyDtoD(dst, src DevicePtr, bytes int) int {
	return int(C.gtc_memcpy_dtod(C.uint64_t(dst), C.uint64_t(src), C.size_t(bytes)))
}

func cMemcpyHtoDAsync(dst DevicePtr, src unsafe.Pointer, bytes int, s Stream) int {
	return int(C.gtc_memcpy_htod_async(C.uint64_t(dst), src, C.size_t(bytes), C.uintptr_t(s)))
}

func cMemcpyDtoHAsync(dst unsafe.Pointer, src DevicePtr, bytes int, s Stream) int {
	return int(C.gtc_memcpy_dtoh_async(dst, C.uint64_t(src), C.size_t(bytes), C.uintptr_t(s)))
}

func cStreamCreate(flags uint32) (Stream, int) {
	var s C.uintptr_t
	r := C.gtc_stream_create(&s, C.uint(flags))
	return Stream(s), int(r)
}

func cStreamSynchronize(s Stream) int { return int(C.gtc_stream_synchronize(C.uintptr_t(s))) }
func cStreamQuery(s Stream) int       { return int(C.gtc_stream_query(C.uintptr_t(s))) }
func cStreamDestroy(s Stream) int     { return int(C.gtc_stream_destroy(C.uintptr_t(s))) }

func cEventCreate(flags uint32) (Event, int) {
	var e C.uintptr_t
	r := C.gtc_event_create(&e, C.uint(flags))
	return Event(e), int(r)
}

func cEventRecord(e Event, s Stream) int {
	return int(C.gtc_event_record(C.uintptr_t(e), C.uintptr_t(s)))
}
func cEventQuery(e Event) int       { return int(C.gtc_event_query(C.uintptr_t(e))) }
func cEventSynchronize(e Event) int { return int(C.gtc_event_synchronize(C.uintptr_t(e))) }

func cEventElapsedTime(start, end Event) (float32, int) {
	var ms C.float
	r := C.gtc_event_elapsed_time(&ms, C.uintptr_t(start), C.uintptr_t(end))
	return float32(ms), int(r)
}

func cEventDestroy(e Event) int { return int(C.gtc_event_destroy(C.uintptr_t(e))) }
