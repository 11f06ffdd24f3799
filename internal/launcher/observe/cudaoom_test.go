package observe

import (
	"errors"
	"strings"
	"testing"

	"github.com/gotrain/gotrain/internal/gpu/gpuinfo"
	gotrainv1 "github.com/gotrain/gotrain/proto/gotrain/v1"
)

func TestFindCUDAOOM(t *testing.T) {
	torch2 := []string{
		"Traceback (most recent call last):",
		`  File "/data/train.py", line 40, in <module>`,
		"    main()",
		`  File "/data/train.py", line 22, in step`,
		"    y = model(x)",
		"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 GiB. GPU 0 has a total capacity of 79.10 GiB of which 18.50 GiB is free.",
	}
	for _, tc := range []struct {
		name        string
		tail        []string
		line, where string // want; line "" for none
	}{
		{"torch 2", torch2, torch2[5], "/data/train.py:40 in <module> > /data/train.py:22 in step"},
		{"torch 1.13", []string{"torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 15.78 GiB total capacity; 14.2 GiB already allocated)"},
			"torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 15.78 GiB total capacity; 14.2 GiB already allocated)", ""},
		{"runtime error", []string{"RuntimeError: CUDA error: out of memory", "CUDA kernel errors might be asynchronously reported at some other API call."}, "RuntimeError: CUDA error: out of memory", ""},
		{"driver API", []string{"train: cuMemAlloc_v2 failed: CUDA_ERROR_OUT_OF_MEMORY"}, "train: cuMemAlloc_v2 failed: CUDA_ERROR_OUT_OF_MEMORY", ""},
		{"error 2", []string{"CUDA error 2 at alloc.cu:12"}, "CUDA error 2 at alloc.cu:12", ""},
		{"NCCL", []string{"node1:77:77 [0] NCCL WARN Cuda failure 'out of memory'"}, "node1:77:77 [0] NCCL WARN Cuda failure 'out of memory'", ""},
		{"chained: the last traceback", append([]string{"Traceback (most recent call last):", `  File "a.py", line 1, in f`, "ValueError: x", "", "During handling of the above exception, another exception occurred:", ""}, torch2...),
			torch2[5], "/data/train.py:40 in <module> > /data/train.py:22 in step"},
		{"host memory is not GPU memory", []string{"MemoryError: Unable to allocate 20.0 GiB"}, "", ""},
		{"error 20 is not error 2", []string{"CUDA error 20 at x.cu:1"}, "", ""},
		{"nothing", []string{"step 3 loss 0.2"}, "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o, ok := FindCUDAOOM(tc.tail)
			if ok != (tc.line != "") || o.Line != tc.line || o.Where() != tc.where {
				t.Errorf("FindCUDAOOM = %+v, %v; want line %q where %q", o, ok, tc.line, tc.where)
			}
		})
	}
}

func TestGPUMemoryNote(t *testing.T) {
	fake := &gpuinfo.Fake{
		Devices: []gpuinfo.Device{{Index: 0}, {Index: 1}},
		Samples: []gpuinfo.Sample{{}, {MemoryUsed: 9 << 30, MemoryTotal: 80 << 30}},
		Procs:   [][]gpuinfo.Process{nil, {{PID: 10, UsedMemory: 520 << 20}, {PID: 11, Name: "python3", UsedMemory: 8 << 30}, {PID: 12}}},
	}
	whose := func(pid int) string {
		if pid == 10 {
			return "gotrain's Python standby for slot 1"
		}
		return ""
	}
	for _, tc := range []struct {
		name    string
		nv      gpuinfo.NVML
		openErr error
		gpu     int
		want    string
	}{
		{"held", fake, nil, 1, "GPU 1 just after the exit: 9.0 GiB of 80.0 GiB in use; held by gotrain's Python standby for slot 1 (pid 10, 520 MiB), another process python3 (pid 11, 8.0 GiB), another process (pid 12)"},
		{"free", fake, nil, 0, "GPU 0 just after the exit: 0 MiB of 0 MiB in use; no process holds memory on it now"},
		{"no driver", nil, &gpuinfo.NoDriverError{Reason: "libnvidia-ml.so.1 not loadable"}, 0, "GPU memory at the time: unknown: no driver on this machine (no NVIDIA driver found (NVML: libnvidia-ml.so.1 not loadable))"},
		{"NVML broken", nil, errors.New("nvmlInit: unknown error"), 0, "GPU memory at the time: unknown: NVML cannot be opened (nvmlInit: unknown error)"},
		{"no GPU", fake, nil, -1, "GPU memory at the time: unknown: the rank was given no GPU of its own"},
		{"no such GPU", fake, nil, 5, "GPU memory at the time: unknown: GPU 5 cannot be read (gpuinfo: GPU 5: no such GPU (have 2))"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := GPUMemoryNote(tc.nv, tc.openErr, tc.gpu, whose); got != tc.want {
				t.Errorf("GPUMemoryNote =\n%s\nwant\n%s", got, tc.want)
			}
		})
	}
}

func TestRootCauseNamesCUDAOOM(t *testing.T) {
	fl := failureJSON(oomFailure())
	if fl.Cause != "rank 3 on node7 ran out of GPU memory" || !strings.Contains(fl.Fixes, "--standby off") {
		t.Errorf("cause %q, fixes %q", fl.Cause, fl.Fixes)
	}
	f := oomFailure()
	f.Signal = "SIGKILL" // the OOM line is not why it ended
	if fl := failureJSON(f); fl.Cause != "" {
		t.Errorf("killed by a signal: cause %q", fl.Cause)
	}
}

func oomFailure() *gotrainv1.WorkerFailure {
	return &gotrainv1.WorkerFailure{Rank: 3, Hostname: "node7", Pid: 99, ExitCode: 1,
		StderrTail: []string{"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."}}
}
