package placement

import (
	"fmt"
	"path/filepath"
	"regexp"
)

var nvidiaDevice = regexp.MustCompile(`^nvidia[0-9]+$`)

// GPUs is what this machine shows of its NVIDIA GPUs: how many, and how
// that was found, for messages that must say what was (not) found.
type GPUs struct {
	N int
	// How says where N comes from ("NVML counts 2") or, for none, why
	// ("no /dev/nvidia0... device files; no NVIDIA driver found (NVML:
	// libnvidia-ml.so.1 not loadable)").
	How string
}

// FindGPUs counts the NVIDIA GPUs the driver exposes on this machine:
// NVML's count (placement.go), else the /dev/nvidiaN device files, which
// need no library, so the launcher can pick its defaults on machines
// without a driver.
func FindGPUs() GPUs {
	n, err := nvmlGPUCount()
	if err == nil {
		return GPUs{N: n, How: fmt.Sprintf("NVML counts %d", n)}
	}
	matches, _ := filepath.Glob("/dev/nvidia*")
	devs := 0
	for _, m := range matches {
		if nvidiaDevice.MatchString(filepath.Base(m)) {
			devs++
		}
	}
	if devs == 0 {
		return GPUs{How: fmt.Sprintf("no /dev/nvidia0... device files; %v", err)}
	}
	return GPUs{N: devs, How: fmt.Sprintf("%d /dev/nvidiaN device file(s), but NVML does not answer: %v", devs, err)}
}

// CountGPUs returns how many NVIDIA GPUs the driver exposes (FindGPUs).
func CountGPUs() int { return FindGPUs().N }
