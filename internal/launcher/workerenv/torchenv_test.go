package workerenv

import (
	"slices"
	"testing"
)

// torchrun's NCCL error handling; the flight recorder's settings use PyTorch's current names, point the dump
// into the log dir, and never override what the user set.
func TestTorchDebugEnv(t *testing.T) {
	got := TorchDebugEnv(nil, "/logs")
	want := []string{"TORCH_FR_BUFFER_SIZE=2000", "TORCH_NCCL_ASYNC_ERROR_HANDLING=1",
		"TORCH_NCCL_DUMP_ON_TIMEOUT=1", "TORCH_FR_DUMP_TEMP_FILE=/logs/nccl_trace_rank_"}
	if !slices.Equal(got, want) {
		t.Errorf("TorchDebugEnv = %q, want %q", got, want)
	}
	got = TorchDebugEnv([]string{"TORCH_FR_BUFFER_SIZE=50", "NCCL_ASYNC_ERROR_HANDLING=0", "HOME=/root"}, "")
	if want := []string{"TORCH_NCCL_DUMP_ON_TIMEOUT=1"}; !slices.Equal(got, want) {
		t.Errorf("with the user's buffer size and no log dir: %q, want %q", got, want)
	}
}
