//go:build !cgo

package cudadrv

func cKernelOpen(string) string {
	return "this binary was built without cgo (CGO_ENABLED=0); rebuild it with cgo to use the CUDA driver"
}
func cModuleLoadData(string) (Module, string, int)                          { return 0, "", notLoaded }
func cModuleGetFunction(Module, string) (Function, int)                     { return 0, notLoaded }
func cModuleUnload(Module) int                                              { return notLoaded }
func cLaunchKernel(Function, Dim3, Dim3, uint32, Stream, []byte, []int) int { return notLoaded }
