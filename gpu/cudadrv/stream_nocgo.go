//go:build !cgo

package cudadrv

func cStreamOpen(string) string {
	return "this binary was built without cgo (CGO_ENABLED=0); rebuild it with cgo to use the CUDA driver"
}
func cStreamWaitEvent(Stream, Event) int                     { return notLoaded }
func cMemcpyDtoDAsync(DevicePtr, DevicePtr, int, Stream) int { return notLoaded }
func cStreamCreateWithPriority(uint32, int) (Stream, int)    { return 0, notLoaded }
func cStreamPriorityRange() (least, greatest, r int)         { return 0, 0, notLoaded }
