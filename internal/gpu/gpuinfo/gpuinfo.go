// Package gpuinfo is what gotrain asks NVML about a node's NVIDIA GPUs:
// identity, health, NVLink wiring, PCIe distance, CPU affinity, processes
// and XID errors, behind the small interface [NVML].
//
// [Open] returns the real implementation, built on NVIDIA's go-nvml, which
// dlopens libnvidia-ml.so.1 at run time: a binary that uses it still starts
// on a machine without a driver, and Open then returns an error matching
// [ErrNoDriver]. [Fake] is an in-memory implementation for tests.
//
// GPUs are numbered as NVML numbers them (PCI bus order), which is also what
// CUDA uses when CUDA_DEVICE_ORDER=PCI_BUS_ID.
package gpuinfo

import (
	"errors"
	"fmt"
	"math/bits"
	"strings"
	"time"
)

// ErrNoDriver matches Open's error when NVML or the driver behind it is
// missing: libnvidia-ml.so.1 cannot be loaded, or it finds no kernel driver.
var ErrNoDriver = errors.New("gpuinfo: no NVIDIA driver")

// NoDriverError is Open's error when NVML or the driver is missing; it
// matches ErrNoDriver.
type NoDriverError struct {
	// Reason is NVML's side of it, e.g. "libnvidia-ml.so.1 not loadable".
	Reason string
}

func (e *NoDriverError) Error() string        { return "no NVIDIA driver found (NVML: " + e.Reason + ")" }
func (e *NoDriverError) Is(target error) bool { return target == ErrNoDriver }

// ErrNotSupported matches errors for queries this GPU or driver does not
// answer (NVML_ERROR_NOT_SUPPORTED); callers show them as N/A.
var ErrNotSupported = errors.New("gpuinfo: not supported")

// NVML is the part of NVML that gotrain uses. GPU indices run from 0 to
// Count()-1. Implementations are safe for concurrent use.
type NVML interface {
	// Count returns the number of GPUs.
	Count() (int, error)
	// DriverVersion returns the kernel driver's version, e.g. "580.159.04".
	DriverVersion() (string, error)
	// CUDADriverVersion returns the CUDA version the driver supports as
	// cuDriverGetVersion does: 13000 for CUDA 13.0.
	CUDADriverVersion() (int, error)
	// Device returns a GPU's identity and placement.
	Device(i int) (Device, error)
	// Sample returns a GPU's state now.
	Sample(i int) (Sample, error)
	// NVLinks returns a GPU's NVLinks, one entry per link the GPU has
	// (an empty slice when it has none or NVML does not support NVLink).
	NVLinks(i int) ([]NVLink, error)
	// CommonAncestor returns the closest PCIe/CPU level two GPUs share
	// (nvmlDeviceGetTopologyCommonAncestor).
	CommonAncestor(i, j int) (Level, error)
	// Processes returns the processes that hold a context on the GPU.
	Processes(i int) ([]Process, error)
	// WatchXID subscribes to XID errors (critical errors the driver
	// reports) of every GPU from now on.
	WatchXID() (XIDWatch, error)
	// Close releases NVML.
	Close() error
}

// XIDWatch receives XID errors.
type XIDWatch interface {
	// Wait returns the XID errors that arrive within timeout (those already
	// queued at once); none and no error when nothing came.
	Wait(timeout time.Duration) ([]XID, error)
	Close() error
}

// Device is a GPU's identity and where it sits.
type Device struct {
	Index int    `json:"index"`
	Name  string `json:"name"`
	UUID  string `json:"uuid"`
	// PCIBusID is NVML's form, e.g. "00000000:07:00.0".
	PCIBusID    string `json:"pci_bus_id"`
	MemoryTotal uint64 `json:"memory_total_bytes"`
	// NUMANode is the NUMA node of the CPUs closest to the GPU, -1 if unknown.
	NUMANode int `json:"numa_node"`
	// CPUs are the ids of the CPUs closest to the GPU (its CPU affinity),
	// ascending; empty if unknown.
	CPUs []int `json:"cpus"`
}

// Sample is a GPU's state at one moment. Values NVML could not give are -1
// (or, for ECC, ECCEnabled false).
type Sample struct {
	// MemoryUsed is what processes use, without the driver's reservation
	// (MemoryReserved), as nvidia-smi counts it.
	MemoryUsed     uint64 `json:"memory_used_bytes"`
	MemoryReserved uint64 `json:"memory_reserved_bytes"`
	MemoryTotal    uint64 `json:"memory_total_bytes"`
	// GPUUtil and MemUtil are percentages over NVML's last sample period.
	GPUUtil int `json:"gpu_util_percent"`
	MemUtil int `json:"mem_util_percent"`
	// PowerW is the draw, PowerLimitW the enforced limit, in watts.
	PowerW      float64 `json:"power_watts"`
	PowerLimitW float64 `json:"power_limit_watts"`
	// TempC is the GPU temperature, SlowdownTempC where the GPU starts to
	// slow itself down, in °C.
	TempC         int `json:"temperature_c"`
	SlowdownTempC int `json:"slowdown_temperature_c"`
	SMClockMHz    int `json:"sm_clock_mhz"`
	// Throttle is the set of reasons the clocks are held down now.
	Throttle Throttle `json:"throttle_reasons"`
	// ECC counts since the last driver load (volatile).
	ECCEnabled     bool   `json:"ecc_enabled"`
	ECCCorrected   uint64 `json:"ecc_corrected"`
	ECCUncorrected uint64 `json:"ecc_uncorrected"`
	// PCIe link now and at most (0: NVML could not tell). An idle GPU
	// lowers its generation to save power; its width stays.
	PCIeGen      int `json:"pcie_gen,omitempty"`
	PCIeMaxGen   int `json:"pcie_max_gen,omitempty"`
	PCIeWidth    int `json:"pcie_width,omitempty"`
	PCIeMaxWidth int `json:"pcie_max_width,omitempty"`
}

// NVLink is one NVLink of a GPU.
type NVLink struct {
	Link   int  `json:"link"`
	Active bool `json:"active"`
	// RemotePCIBusID is the bus id of the other end (a GPU or an NVSwitch),
	// in NVML's form; empty when the link is down.
	RemotePCIBusID string `json:"remote_pci_bus_id,omitempty"`
	// RemoteIsSwitch is set when the other end is an NVSwitch.
	RemoteIsSwitch bool `json:"remote_is_switch,omitempty"`
}

// Process is a process with a context on a GPU.
type Process struct {
	PID        int    `json:"pid"`
	Name       string `json:"name,omitempty"`
	UsedMemory uint64 `json:"used_memory_bytes"` // 0 when NVML cannot tell
}

// XID is one XID error event.
type XID struct {
	GPU  int    `json:"gpu"`
	Code uint64 `json:"xid"`
}

// Level is how far apart two GPUs are over PCIe (NVML's GpuTopologyLevel).
type Level int

// The levels, closest first; the numbers are NVML's.
const (
	LevelInternal   Level = 0  // the same board (multi-GPU boards)
	LevelSingle     Level = 10 // PIX: at most one PCIe bridge
	LevelMultiple   Level = 20 // PXB: several PCIe bridges, no host bridge
	LevelHostBridge Level = 30 // PHB: through a PCIe host bridge (the CPU)
	LevelNode       Level = 40 // NODE: between host bridges of one NUMA node
	LevelSystem     Level = 50 // SYS: across NUMA nodes (QPI/UPI/Infinity Fabric)
)

// String returns nvidia-smi's short name: PIX, PXB, PHB, NODE, SYS (and
// "X" for the same board).
func (l Level) String() string {
	switch l {
	case LevelInternal:
		return "X"
	case LevelSingle:
		return "PIX"
	case LevelMultiple:
		return "PXB"
	case LevelHostBridge:
		return "PHB"
	case LevelNode:
		return "NODE"
	case LevelSystem:
		return "SYS"
	}
	return fmt.Sprintf("LEVEL%d", int(l))
}

// Throttle is NVML's clock event (throttle) reasons bit set.
type Throttle uint64

// The reasons, with NVML's bit values.
const (
	ThrottleGPUIdle      Throttle = 0x1
	ThrottleAppClocks    Throttle = 0x2
	ThrottleSwPowerCap   Throttle = 0x4
	ThrottleHwSlowdown   Throttle = 0x8
	ThrottleSyncBoost    Throttle = 0x10
	ThrottleSwThermal    Throttle = 0x20
	ThrottleHwThermal    Throttle = 0x40
	ThrottleHwPowerBrake Throttle = 0x80
	ThrottleDisplayClock Throttle = 0x100
	ThrottleBoardLimit   Throttle = 0x200
	ThrottleReliability  Throttle = 0x400
	throttleKnown        Throttle = 0x7ff
	ThrottleHarmful               = ThrottleSwPowerCap | ThrottleHwSlowdown | ThrottleSwThermal | ThrottleHwThermal | ThrottleHwPowerBrake
	ThrottleThermal               = ThrottleSwThermal | ThrottleHwThermal
	ThrottlePower                 = ThrottleSwPowerCap | ThrottleHwPowerBrake
)

var throttleNames = []struct {
	bit  Throttle
	name string
}{
	{ThrottleGPUIdle, "gpu_idle"},
	{ThrottleAppClocks, "applications_clocks_setting"},
	{ThrottleSwPowerCap, "sw_power_cap"},
	{ThrottleHwSlowdown, "hw_slowdown"},
	{ThrottleSyncBoost, "sync_boost"},
	{ThrottleSwThermal, "sw_thermal_slowdown"},
	{ThrottleHwThermal, "hw_thermal_slowdown"},
	{ThrottleHwPowerBrake, "hw_power_brake_slowdown"},
	{ThrottleDisplayClock, "display_clock_setting"},
	{ThrottleBoardLimit, "board_limit"},
	{ThrottleReliability, "reliability"},
}

// Names returns the reasons set, in bit order, as snake_case words.
func (t Throttle) Names() []string {
	var out []string
	for _, n := range throttleNames {
		if t&n.bit != 0 {
			out = append(out, n.name)
		}
	}
	if rest := t &^ throttleKnown; rest != 0 {
		out = append(out, fmt.Sprintf("unknown(%#x)", uint64(rest)))
	}
	return out
}

// String returns the reasons joined by commas, or "none".
func (t Throttle) String() string {
	if t == 0 {
		return "none"
	}
	return strings.Join(t.Names(), ",")
}

// MarshalJSON writes the reasons as a list of names.
func (t Throttle) MarshalJSON() ([]byte, error) {
	names := t.Names()
	var b strings.Builder
	b.WriteByte('[')
	for i, n := range names {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, "%q", n)
	}
	b.WriteByte(']')
	return []byte(b.String()), nil
}

// BusIDKey returns a PCI bus id in one canonical form, so that NVML's
// "00000000:07:00.0", CUDA's "0000:07:00.0" and sysfs names compare equal:
// lower case, a four-digit domain.
func BusIDKey(id string) string {
	id = strings.ToLower(strings.TrimSpace(id))
	dom, rest, ok := strings.Cut(id, ":")
	if !ok || strings.Count(rest, ":") != 1 {
		return id
	}
	dom = strings.TrimLeft(dom, "0")
	for len(dom) < 4 {
		dom = "0" + dom
	}
	return dom + ":" + rest
}

// bitsToIDs turns a CPU (or node) mask of machine words into ids.
func bitsToIDs(set []uint) []int {
	var ids []int
	for w, word := range set {
		for word != 0 {
			b := bits.TrailingZeros(word)
			ids = append(ids, w*bits.UintSize+b)
			word &^= 1 << b
		}
	}
	return ids
}
