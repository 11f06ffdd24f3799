package launcher

import (
	"path/filepath"
	"regexp"
)

var nvidiaDevice = regexp.MustCompile(`^nvidia[0-9]+$`)

// CountGPUs returns how many NVIDIA GPUs the driver exposes on this machine:
// NVML's count (placement.go), else the /dev/nvidiaN device files, which
// need no library, so the launcher can pick its defaults on machines
// without a driver.
func CountGPUs() int {
	if n, ok := nvmlGPUCount(); ok {
		return n
	}
	matches, _ := filepath.Glob("/dev/nvidia*")
	n := 0
	for _, m := range matches {
		if nvidiaDevice.MatchString(filepath.Base(m)) {
			n++
		}
	}
	return n
}
