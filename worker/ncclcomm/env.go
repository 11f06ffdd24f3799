package ncclcomm

import (
	"os"
	"sync"
)

// ncclDefaults are the NCCL variables gotrain's workers set for themselves
// when the environment does not: NCCL reads them once, at its first
// communicator, for the whole process.
//
// NCCL_CUMEM_ENABLE=0 makes NCCL share its peer-to-peer buffers with the
// CUDA IPC of cudaMalloc'd memory instead of cuMem handles passed through
// its proxy thread. Connecting a new communicator (at its first collective)
// then takes ~10 ms instead of ~165 ms on 2 × H200, which is most of what
// an in-process recovery waits for after the NCCL init (in-process recovery
// 0.33–0.39 s instead of 0.49–0.52 s with --standby); all-reduce bandwidth
// is the same (331 vs 328 GB/s at 1 GiB, 268 vs 270 at 64 MiB) and the
// 8-byte latency within a microsecond (bench/results/restart-*.md,
// cumem-*.txt). gotrain keeps NVLink SHARP off anyway, which is what
// needs cuMem. A value in the environment (also "1") wins; a value in
// nccl.conf does not, since NCCL only fills in variables that are unset.
var ncclDefaults = [][2]string{
	{"NCCL_CUMEM_ENABLE", "0"},
}

var defaultsOnce sync.Once

// applyNCCLDefaults sets ncclDefaults that the environment lacks, once,
// before NCCL reads its environment (Prewarm and New call it first).
func applyNCCLDefaults() {
	defaultsOnce.Do(func() { setDefaults(os.LookupEnv, os.Setenv) })
}

func setDefaults(lookup func(string) (string, bool), setenv func(k, v string) error) {
	for _, kv := range ncclDefaults {
		if _, set := lookup(kv[0]); !set {
			_ = setenv(kv[0], kv[1])
		}
	}
}
