package observe

import (
	"errors"
	"fmt"
	"regexp"
	"strings"

	"github.com/gotrain/gotrain/internal/gpu/gpuinfo"
)

// A rank that ran out of GPU memory exits like any failing program (status
// 1, a Python traceback); only its last lines say why. FindCUDAOOM reads
// them, GPUMemoryNote says what held the GPU's memory just after, and
// OOMFixes what usually makes a step fit. The kernel's OOM killer (host
// memory) is ExamineExit's.

// cudaOOMRE matches the lines CUDA, torch and NCCL print when a GPU
// allocation fails: torch's OutOfMemoryError (torch.cuda.OutOfMemoryError
// before torch 2.5), the runtime's "CUDA error: out of memory" (error 2,
// cudaErrorMemoryAllocation), the driver API's CUDA_ERROR_OUT_OF_MEMORY and
// a failed cuMemAlloc, NCCL's "Cuda failure 'out of memory'".
var cudaOOMRE = regexp.MustCompile(`OutOfMemoryError\b|CUDA out of memory|CUDA error: out of memory|CUDA error 2\b|cudaErrorMemoryAllocation|CUDA_ERROR_OUT_OF_MEMORY|cuMemAlloc\w*\b.*(fail|error|out of memory)|Cuda failure '?out of memory`)

// frameRE is a Python traceback frame: `  File "train.py", line 31, in step`.
var frameRE = regexp.MustCompile(`^\s*File "([^"]+)", line (\d+), in (\S+)`)

// CUDAOOM is a CUDA out-of-memory error found in a worker's stderr.
type CUDAOOM struct {
	// Line is the line that says so.
	Line string
	// Frames are the Python traceback's frames before Line, outermost
	// first, as far as the tail holds them ("train.py:31 in step"); nil
	// when there is no traceback.
	Frames []string
}

// Where is the traceback position: the frames, outermost first; "" when
// there are none.
func (o CUDAOOM) Where() string { return strings.Join(o.Frames, " > ") }

// FindCUDAOOM finds the last CUDA out-of-memory error in tail (a worker's
// last lines of stderr).
func FindCUDAOOM(tail []string) (CUDAOOM, bool) {
	at := -1
	for i := len(tail) - 1; i >= 0; i-- {
		if cudaOOMRE.MatchString(tail[i]) {
			at = i
			break
		}
	}
	if at < 0 {
		return CUDAOOM{}, false
	}
	o := CUDAOOM{Line: strings.TrimSpace(tail[at])}
	for _, l := range tail[:at] {
		if strings.HasPrefix(l, "Traceback (most recent call last):") {
			o.Frames = nil // a chained exception's: only the last traceback counts
			continue
		}
		if m := frameRE.FindStringSubmatch(l); m != nil {
			o.Frames = append(o.Frames, fmt.Sprintf("%s:%s in %s", m[1], m[2], m[3]))
		}
	}
	return o, true
}

// OOMFixes is what usually makes a training step fit in GPU memory.
const OOMFixes = "to fit: a smaller batch per GPU, mixed precision (torch.autocast with bf16 or fp16), " +
	"gradient accumulation, activation checkpointing (torch.utils.checkpoint); " +
	"gotrain's Python standby holds about 500 MiB on each GPU while it waits: --standby off frees it"

// GPUMemoryNote says how much memory GPU gpu had in use, and who held it,
// just after a rank on it ran out: nv is NVML (nil when Open failed with
// openErr), whose names a process of this node by pid ("" for one that is
// not gotrain's).
func GPUMemoryNote(nv gpuinfo.NVML, openErr error, gpu int, whose func(pid int) string) string {
	const unknown = "GPU memory at the time: unknown: "
	switch {
	case nv == nil && errors.Is(openErr, gpuinfo.ErrNoDriver):
		return unknown + "no driver on this machine (" + openErr.Error() + ")"
	case nv == nil:
		return unknown + fmt.Sprintf("NVML cannot be opened (%v)", openErr)
	case gpu < 0:
		return unknown + "the rank was given no GPU of its own"
	}
	s, err := nv.Sample(gpu)
	if err != nil {
		return unknown + fmt.Sprintf("GPU %d cannot be read (%v)", gpu, err)
	}
	procs, perr := nv.Processes(gpu)
	return describeGPUMemory(gpu, s, procs, perr, whose)
}

// describeGPUMemory writes GPUMemoryNote's line from a sample and the
// GPU's processes.
func describeGPUMemory(gpu int, s gpuinfo.Sample, procs []gpuinfo.Process, perr error, whose func(pid int) string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "GPU %d just after the exit: %s of %s in use", gpu, bytesIEC(s.MemoryUsed), bytesIEC(s.MemoryTotal))
	if perr != nil {
		fmt.Fprintf(&b, "; who holds it cannot be read (%v)", perr)
		return b.String()
	}
	if len(procs) == 0 {
		b.WriteString("; no process holds memory on it now")
		return b.String()
	}
	b.WriteString("; held by ")
	for i, p := range procs {
		if i > 0 {
			b.WriteString(", ")
		}
		who := whose(p.PID)
		if who == "" {
			who = "another process"
			if p.Name != "" {
				who += " " + p.Name
			}
		}
		fmt.Fprintf(&b, "%s (pid %d", who, p.PID)
		if p.UsedMemory > 0 {
			fmt.Fprintf(&b, ", %s", bytesIEC(p.UsedMemory))
		}
		b.WriteString(")")
	}
	return b.String()
}

// bytesIEC writes n as GiB with one decimal from 1 GiB on, else as MiB.
func bytesIEC(n uint64) string {
	if n >= 1<<30 {
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	}
	return fmt.Sprintf("%d MiB", n>>20)
}
