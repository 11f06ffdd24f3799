//go:build !cgo

package gpuinfo

// Open says that NVML needs cgo: go-nvml calls the library through cgo.
func Open() (NVML, error) {
	return nil, &noDriverError{"this binary was built without cgo (CGO_ENABLED=0); rebuild it with cgo to use NVML"}
}

type noDriverError struct{ why string }

func (e *noDriverError) Error() string        { return "no NVIDIA driver found (NVML: " + e.why + ")" }
func (e *noDriverError) Is(target error) bool { return target == ErrNoDriver }
