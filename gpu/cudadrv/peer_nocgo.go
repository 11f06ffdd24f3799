//go:build !cgo

package cudadrv

func cPeerOpen(string) string {
	return "this binary was built without cgo (CGO_ENABLED=0); rebuild it with cgo to use the CUDA driver"
}
func cIPCGetMemHandle(DevicePtr) (IPCMemHandle, int)            { return IPCMemHandle{}, notLoaded }
func cIPCOpenMemHandle(IPCMemHandle) (DevicePtr, int)           { return 0, notLoaded }
func cIPCCloseMemHandle(DevicePtr) int                          { return notLoaded }
func cCtxGetDevice() (Device, int)                              { return 0, notLoaded }
func cDeviceCanAccessPeer(Device, Device) (bool, int)           { return false, notLoaded }
func cDeviceByPCIBusID(string) (Device, int)                    { return 0, notLoaded }
func cCtxEnablePeerAccess(Context) int                          { return notLoaded }
func cStreamWriteValue32(Stream, DevicePtr, uint32, uint32) int { return notLoaded }
func cStreamWaitValue32(Stream, DevicePtr, uint32, uint32) int  { return notLoaded }
func cMemGetAddressRange(DevicePtr) (DevicePtr, int, int)       { return 0, 0, notLoaded }
