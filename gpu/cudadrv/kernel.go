package cudadrv

import (
	"encoding/binary"
	"fmt"
	"math"
	"strings"
)

// Module is a CUmodule: code loaded into the current context.
type Module uintptr

// Function is a CUfunction: a kernel of a Module.
type Function uintptr

// Dim3 is a grid or block size.
type Dim3 struct{ X, Y, Z uint32 }

// kernelCalls are the module and launch entry points.
var kernelCalls = callSet{open: cKernelOpen}

func openKernelCalls() error { return kernelCalls.ensure() }

// LoadModule loads PTX (or a cubin) into the current context
// (cuModuleLoadDataEx); the driver compiles PTX for the device. A PTX error
// carries the compiler's log.
func LoadModule(image string) (Module, error) {
	if err := openKernelCalls(); err != nil {
		return 0, err
	}
	m, log, r := cModuleLoadData(image)
	if err := check("cuModuleLoadDataEx", r); err != nil {
		if log = strings.TrimSpace(log); log != "" {
			return 0, fmt.Errorf("%w: %s", err, strings.ReplaceAll(log, "\n", "; "))
		}
		return 0, err
	}
	return m, nil
}

// Function returns the kernel called name (cuModuleGetFunction).
func (m Module) Function(name string) (Function, error) {
	f, r := cModuleGetFunction(m, name)
	return f, check("cuModuleGetFunction", r)
}

// Unload unloads m (cuModuleUnload).
func (m Module) Unload() error { return check("cuModuleUnload", cModuleUnload(m)) }

// Launch enqueues f on s with grid × block threads (cuLaunchKernel). Each
// argument is one kernel parameter: a DevicePtr, uintptr, uint64, int64,
// float64 (8 bytes) or an int32, uint32, float32 (4 bytes); an int is
// passed as 32 bits. At most 32 parameters.
func (f Function) Launch(grid, block Dim3, sharedMem uint32, s Stream, args ...any) error {
	if len(args) > 32 {
		return fmt.Errorf("cudadrv: Launch with %d parameters, at most 32", len(args))
	}
	var buf []byte
	offsets := make([]int, len(args))
	put := func(i int, size int, v uint64) {
		for len(buf)%size != 0 {
			buf = append(buf, 0)
		}
		offsets[i] = len(buf)
		if size == 8 {
			buf = binary.LittleEndian.AppendUint64(buf, v)
		} else {
			buf = binary.LittleEndian.AppendUint32(buf, uint32(v))
		}
	}
	for i, a := range args {
		switch v := a.(type) {
		case DevicePtr:
			put(i, 8, uint64(v))
		case uintptr:
			put(i, 8, uint64(v))
		case uint64:
			put(i, 8, v)
		case int64:
			put(i, 8, uint64(v))
		case float64:
			put(i, 8, math.Float64bits(v))
		case int32:
			put(i, 4, uint64(uint32(v)))
		case uint32:
			put(i, 4, uint64(v))
		case int:
			if v < math.MinInt32 || v > math.MaxUint32 {
				return fmt.Errorf("cudadrv: Launch parameter %d: %d does not fit 32 bits", i, v)
			}
			put(i, 4, uint64(uint32(v)))
		case float32:
			put(i, 4, uint64(math.Float32bits(v)))
		default:
			return fmt.Errorf("cudadrv: Launch parameter %d: unsupported type %T", i, a)
		}
	}
	if grid.Y == 0 {
		grid.Y = 1
	}
	if grid.Z == 0 {
		grid.Z = 1
	}
	if block.Y == 0 {
		block.Y = 1
	}
	if block.Z == 0 {
		block.Z = 1
	}
	if err := openKernelCalls(); err != nil {
		return err
	}
	return check("cuLaunchKernel", cLaunchKernel(f, grid, block, sharedMem, s, buf, offsets))
}

// AXPYName is the kernel in AXPYPTX: y[i] = a*x[i] + y[i] for i < n, with
// parameters (y, x DevicePtr, a float32, n uint32), one thread per element.
const AXPYName = "gotrain_axpy"

// AXPYPTX returns the hand-written PTX of the AXPYName kernel for a device
// of compute capability major.minor. It targets the oldest architecture
// (sm_52 up to sm_75) that the device runs, in PTX ISA 6.4 (CUDA 10.0), so
// any driver since 410 compiles it.
func AXPYPTX(major, minor int) string {
	target := "sm_52"
	switch cc := major*10 + minor; {
	case cc >= 75:
		target = "sm_75"
	case cc >= 70:
		target = "sm_70"
	case cc >= 60:
		target = "sm_60"
	}
	return fmt.Sprintf(axpyPTX, target)
}

const axpyPTX = `.version 6.4
.target %s
.address_size 64

.visible .entry gotrain_axpy(
	.param .u64 param_y,
	.param .u64 param_x,
	.param .f32 param_a,
	.param .u32 param_n
)
{
	.reg .pred %%p<2>;
	.reg .b32 %%r<6>;
	.reg .f32 %%f<4>;
	.reg .b64 %%rd<6>;

	ld.param.u64 %%rd1, [param_y];
	ld.param.u64 %%rd2, [param_x];
	ld.param.f32 %%f1, [param_a];
	ld.param.u32 %%r1, [param_n];
	mov.u32 %%r2, %%ctaid.x;
	mov.u32 %%r3, %%ntid.x;
	mov.u32 %%r4, %%tid.x;
	mad.lo.s32 %%r5, %%r2, %%r3, %%r4;
	setp.ge.u32 %%p1, %%r5, %%r1;
	@%%p1 bra DONE;
	cvta.to.global.u64 %%rd1, %%rd1;
	cvta.to.global.u64 %%rd2, %%rd2;
	mul.wide.u32 %%rd3, %%r5, 4;
	add.s64 %%rd4, %%rd2, %%rd3;
	add.s64 %%rd5, %%rd1, %%rd3;
	ld.global.f32 %%f2, [%%rd4];
	ld.global.f32 %%f3, [%%rd5];
	fma.rn.f32 %%f3, %%f1, %%f2, %%f3;
	st.global.f32 [%%rd5], %%f3;
DONE:
	ret;
}
`
