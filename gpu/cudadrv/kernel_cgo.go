//go:build cgo

package cudadrv

// cgo calls of the module and launch part (kernel_shim.c).

/*
#cgo LDFLAGS: -ldl
#include "kernel_shim.h"
*/
import "C"

import "unsafe"

func cKernelOpen(path string) string {
	cpath := C.CString(path)
	defer C.free(unsafe.Pointer(cpath))
	var buf [1024]C.char
	if C.gtk_open(cpath, &buf[0], C.size_t(len(buf))) != 0 {
		return C.GoString(&buf[0])
	}
	return ""
}

func cModuleLoadData(image string) (Module, string, int) {
	cimg := C.CString(image)
	defer C.free(unsafe.Pointer(cimg))
	const logLen = 4096
	log := (*C.char)(C.calloc(logLen, 1))
	defer C.free(unsafe.Pointer(log))
	var m C.uintptr_t
	r := C.gtk_module_load_data(&m, cimg, log, logLen)
	return Module(m), C.GoString(log), int(r)
}

func cModuleGetFunction(m Module, name string) (Function, int) {
	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	var f C.uintptr_t
	r := C.gtk_module_get_function(&f, C.uintptr_t(m), cname)
	return Function(f), int(r)
}

func cModuleUnload(m Module) int { return int(C.gtk_module_unload(C.uintptr_t(m))) }

func cLaunchKernel(f Function, grid, block Dim3, shared uint32, s Stream, args []byte, offsets []int) int {
	n := len(offsets)
	buf := C.malloc(C.size_t(max(len(args), 1)))
	defer C.free(buf)
	if len(args) > 0 {
		copy(unsafe.Slice((*byte)(buf), len(args)), args)
	}
	offs := (*C.size_t)(C.malloc(C.size_t(max(n, 1)) * C.size_t(unsafe.Sizeof(C.size_t(0)))))
	defer C.free(unsafe.Pointer(offs))
	offSlice := unsafe.Slice(offs, max(n, 1))
	for i, o := range offsets {
		offSlice[i] = C.size_t(o)
	}
	return int(C.gtk_launch_kernel(C.uintptr_t(f), C.uint(grid.X), C.uint(grid.Y), C.uint(grid.Z),
		C.uint(block.X), C.uint(block.Y), C.uint(block.Z), C.uint(shared), C.uintptr_t(s), buf, offs, C.int(n)))
}
