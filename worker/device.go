package worker

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/gotrain/gotrain/worker/ncclcomm"
)

// rankDevice is the CUDA device a rank of the NCCL backend uses for the
// node's GPU gpu (GOTRAIN_GPU), never a silent guess: a GPU that
// CUDA_VISIBLE_DEVICES (as getenv reads it) leaves out is an error (the
// rank cannot see its GPU, and another rank's would be used); no GPU at
// all (-1: the agent had no NVML to place ranks on GPUs) uses the local
// rank's device, and warn says so.
func rankDevice(localRank, gpu int, getenv func(string) string, warn func(string)) (int, error) {
	if gpu < 0 {
		warn(fmt.Sprintf("no GPU was assigned to this rank (the agent found no NVML to place ranks on GPUs): using CUDA device %d, its local rank", localRank))
		return localRank, nil
	}
	if v := getenv("CUDA_VISIBLE_DEVICES"); strings.Contains(v, ",") {
		seen := false
		for _, id := range strings.Split(v, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(id))
			if err != nil {
				return ncclcomm.DeviceFor(gpu, getenv), nil // UUIDs: CUDA's own names, not ours to check
			}
			seen = seen || n == gpu
		}
		if !seen {
			return 0, fmt.Errorf("its GPU %d (GOTRAIN_GPU) is not in CUDA_VISIBLE_DEVICES=%s, so it cannot see it: let gotrain launch set CUDA_VISIBLE_DEVICES (do not change it in the program's environment)", gpu, v)
		}
	}
	return ncclcomm.DeviceFor(gpu, getenv), nil
}
