//go:build !cgo

package gpuinfo

// Open says that NVML needs cgo: go-nvml calls the library through cgo.
func Open() (NVML, error) {
	return nil, &NoDriverError{Reason: "this binary was built without cgo (CGO_ENABLED=0); rebuild it with cgo to use NVML"}
}
