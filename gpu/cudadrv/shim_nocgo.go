//go:build !cgo

package cudadrv

import "unsafe"

// Without cgo the driver cannot be called: Load says so, and every other
// call answers notLoaded.

func cOpen(string) string {
	return "this binary was built without cgo (CGO_ENABLED=0); rebuild it with cgo to use the CUDA driver"
}

func cInit() int                                                  { return notLoaded }
func cDriverVersion() (int, int)                                  { return 0, notLoaded }
func cErrorName(int) string                                       { return "" }
func cErrorString(int) string                                     { return "" }
func cDeviceCount() (int, int)                                    { return 0, notLoaded }
func cDeviceGet(int) (Device, int)                                { return 0, notLoaded }
func cDeviceName(Device) (string, int)                            { return "", notLoaded }
func cDevicePCIBusID(Device) (string, int)                        { return "", notLoaded }
func cDeviceAttribute(int, Device) (int, int)                     { return 0, notLoaded }
func cDeviceTotalMem(Device) (uint64, int)                        { return 0, notLoaded }
func cPrimaryCtxRetain(Device) (Context, int)                     { return 0, notLoaded }
func cPrimaryCtxRelease(Device) int                               { return notLoaded }
func cCtxSetCurrent(Context) int                                  { return notLoaded }
func cCtxGetCurrent() (Context, int)                              { return 0, notLoaded }
func cCtxSynchronize() int                                        { return notLoaded }
func cMemAlloc(int) (DevicePtr, int)                              { return 0, notLoaded }
func cMemFree(DevicePtr) int                                      { return notLoaded }
func cMemsetD8(DevicePtr, uint8, int) int                         { return notLoaded }
func cMemsetD32(DevicePtr, uint32, int) int                       { return notLoaded }
func cMemsetD8Async(DevicePtr, uint8, int, Stream) int            { return notLoaded }
func cMemsetD32Async(DevicePtr, uint32, int, Stream) int          { return notLoaded }
func cMemcpyHtoD(DevicePtr, unsafe.Pointer, int) int              { return notLoaded }
func cMemcpyDtoH(unsafe.Pointer, DevicePtr, int) int              { return notLoaded }
func cMemcpyDtoD(DevicePtr, DevicePtr, int) int                   { return notLoaded }
func cMemcpyHtoDAsync(DevicePtr, unsafe.Pointer, int, Stream) int { return notLoaded }
func cMemcpyDtoHAsync(unsafe.Pointer, DevicePtr, int, Stream) int { return notLoaded }
func cStreamCreate(uint32) (Stream, int)                          { return 0, notLoaded }
func cStreamSynchronize(Stream) int                               { return notLoaded }
func cStreamQuery(Stream) int                                     { return notLoaded }
func cStreamDestroy(Stream) int                                   { return notLoaded }
func cEventCreate(uint32) (Event, int)                            { return 0, notLoaded }
func cEventRecord(Event, Stream) int                              { return notLoaded }
func cEventQuery(Event) int                                       { return notLoaded }
func cEventSynchronize(Event) int                                 { return notLoaded }
func cEventElapsedTime(Event, Event) (float32, int)               { return 0, notLoaded }
func cEventDestroy(Event) int                                     { return notLoaded }
