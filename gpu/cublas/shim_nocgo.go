//go:build !cgo

package cublas

func cOpen(string) string {
	return "this binary was built without cgo (CGO_ENABLED=0); rebuild it with cgo to use cuBLAS"
}
func cGetVersion(uintptr) (int, int)     { return 0, notLoaded }
func cCreate() (uintptr, int)            { return 0, notLoaded }
func cDestroy(uintptr) int               { return notLoaded }
func cSetStream(uintptr, uintptr) int    { return notLoaded }
func cSetMathMode(uintptr, int) int      { return notLoaded }
func cSetSmCountTarget(uintptr, int) int { return notLoaded }
func cSgemm(uintptr, Op, Op, int, int, int, float32, uintptr, int, uintptr, int, float32, uintptr, int) int {
	return notLoaded
}
func cGemmEx(uintptr, Op, Op, int, int, int, float32, uintptr, DataType, int, uintptr, DataType, int, float32, uintptr, DataType, int, ComputeType) int {
	return notLoaded
}
