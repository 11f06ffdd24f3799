//go:build !cgo

package cudadrv

import "unsafe"

func cHostOpen(string) string {
	return "this binary was built without cgo (CGO_ENABLED=0); rebuild it with cgo to use the CUDA driver"
}
func cMemHostRegister(unsafe.Pointer, int, uint32) int { return notLoaded }
func cMemHostUnregister(unsafe.Pointer) int            { return notLoaded }
