package workerenv

import (
	"path/filepath"
	"strings"
)

// torchTraceEntries is how many collectives PyTorch's NCCL flight recorder
// keeps, like gotrain's own (worker/flight).
const torchTraceEntries = "2000"

// TorchDebugEnv returns torchrun's NCCL error handling and the settings
// that make PyTorch workers keep a flight
// recorder of their NCCL collectives and dump it when a collective times out:
// the dump goes to logDir/nccl_trace_rank_N (PyTorch appends the rank), or
// PyTorch's default (/tmp) without a log dir. Variables the user set in base
// are left alone. The names are PyTorch 2.6's and later's (TORCH_FR_*):
// PyTorch 2.11 warns on every rank when the older TORCH_NCCL_TRACE_BUFFER_SIZE
// or TORCH_NCCL_DEBUG_INFO_TEMP_FILE are set, so older PyTorch gets no
// flight recorder unless the user sets those.
func TorchDebugEnv(base []string, logDir string) []string {
	set := map[string]bool{}
	for _, kv := range base {
		k, _, _ := strings.Cut(kv, "=")
		set[k] = true
	}
	var env []string
	add := func(k, v string) {
		if !set[k] {
			env = append(env, k+"="+v)
		}
	}
	add("TORCH_FR_BUFFER_SIZE", torchTraceEntries)
	// As torchrun: a failed NCCL collective aborts the communicator and
	// fails the rank instead of hanging it. Only the current name: from
	// PyTorch 2.2 on the older NCCL_ASYNC_ERROR_HANDLING puts a deprecation
	// warning into every rank's output. PyTorch before 2.2 reads only the
	// older name, which the torch hook (internal/torchhook) sets in the
	// process from this one. A user's setting of either name stands.
	if !set["NCCL_ASYNC_ERROR_HANDLING"] {
		add("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
	}
	add("TORCH_NCCL_DUMP_ON_TIMEOUT", "1")
	if logDir != "" {
		if abs, err := filepath.Abs(logDir); err == nil {
			logDir = abs
		}
		prefix := filepath.Join(logDir, "nccl_trace_rank_")
		add("TORCH_FR_DUMP_TEMP_FILE", prefix)
	}
	return env
}
