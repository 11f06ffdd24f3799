//go:build cgo

package gpuinfo

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// maxCPUs bounds the CPU ids Device's affinity can name.
const maxCPUs = 4096

// maxNUMANodes bounds the NUMA node ids NVML's memory affinity can name.
const maxNUMANodes = 1024

// Open initialises NVML and returns it. Without libnvidia-ml.so.1 or a
// loaded kernel driver the error matches ErrNoDriver and is one line.
func Open() (NVML, error) {
	lib := nvml.New()
	if r := lib.Init(); r != nvml.SUCCESS {
		return nil, initError(r)
	}
	return &real{lib: lib}, nil
}

func initError(r nvml.Return) error {
	switch r {
	case nvml.ERROR_LIBRARY_NOT_FOUND:
		return &NoDriverError{Reason: "libnvidia-ml.so.1 not loadable"}
	case nvml.ERROR_DRIVER_NOT_LOADED:
		return &NoDriverError{Reason: "the NVIDIA kernel driver is not loaded"}
	case nvml.ERROR_NO_PERMISSION:
		return fmt.Errorf("gpuinfo: NVML init: no permission to open /dev/nvidia* (are you in the video group?): %s", nvml.ErrorString(r))
	}
	return fmt.Errorf("gpuinfo: NVML init: %s", nvml.ErrorString(r))
}

// real is NVML through go-nvml.
type real struct {
	lib nvml.Interface

	mu      sync.Mutex
	handles map[int]nvml.Device
}

var _ NVML = (*real)(nil)

func nvErr(op string, r nvml.Return) error {
	if r == nvml.SUCCESS {
		return nil
	}
	if r == nvml.ERROR_NOT_SUPPORTED {
		return fmt.Errorf("%s: %w", op, ErrNotSupported)
	}
	return fmt.Errorf("gpuinfo: %s: %s", op, nvml.ErrorString(r))
}

func (n *real) handle(i int) (nvml.Device, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if d, ok := n.handles[i]; ok {
		return d, nil
	}
	d, r := n.lib.DeviceGetHandleByIndex(i)
	if err := nvErr(fmt.Sprintf("GPU %d: nvmlDeviceGetHandleByIndex", i), r); err != nil {
		return nil, err
	}
	if n.handles == nil {
		n.handles = map[int]nvml.Device{}
	}
	n.handles[i] = d
	return d, nil
}

func (n *real) Count() (int, error) {
	c, r := n.lib.DeviceGetCount()
	return c, nvErr("nvmlDeviceGetCount", r)
}

func (n *real) DriverVersion() (string, error) {
	v, r := n.lib.SystemGetDriverVersion()
	return v, nvErr("nvmlSystemGetDriverVersion", r)
}

func (n *real) CUDADriverVersion() (int, error) {
	v, r := n.lib.SystemGetCudaDriverVersion_v2()
	if r != nvml.SUCCESS {
		v, r = n.lib.SystemGetCudaDriverVersion()
	}
	return v, nvErr("nvmlSystemGetCudaDriverVersion", r)
}

func cString(b []int8) string {
	var sb strings.Builder
	for _, c := range b {
		if c == 0 {
			break
		}
		sb.WriteByte(byte(c))
	}
	return sb.String()
}

func busID(p nvml.PciInfo) string {
	if s := cString(p.BusId[:]); s != "" {
		return s
	}
	return cString(p.BusIdLegacy[:])
}

func (n *real) Device(i int) (Device, error) {
	d, err := n.handle(i)
	if err != nil {
		return Device{}, err
	}
	dev := Device{Index: i, NUMANode: -1}
	var r nvml.Return
	if dev.Name, r = d.GetName(); r != nvml.SUCCESS {
		return dev, nvErr(fmt.Sprintf("GPU %d: nvmlDeviceGetName", i), r)
	}
	if dev.UUID, r = d.GetUUID(); r != nvml.SUCCESS {
		return dev, nvErr(fmt.Sprintf("GPU %d: nvmlDeviceGetUUID", i), r)
	}
	pci, r := d.GetPciInfo()
	if r != nvml.SUCCESS {
		return dev, nvErr(fmt.Sprintf("GPU %d: nvmlDeviceGetPciInfo", i), r)
	}
	dev.PCIBusID = busID(pci)
	if m, r := d.GetMemoryInfo(); r == nvml.SUCCESS {
		dev.MemoryTotal = m.Total
	}
	if set, r := d.GetCpuAffinity(maxCPUs); r == nvml.SUCCESS {
		dev.CPUs = bitsToIDs(set)
	}
	// The NUMA node of the CPUs nearest the GPU: NVML's memory affinity
	// (node scope), else what the kernel says about the PCI device.
	if set, r := d.GetMemoryAffinity(maxNUMANodes, nvml.AFFINITY_SCOPE_NODE); r == nvml.SUCCESS {
		if ids := bitsToIDs(set); len(ids) == 1 {
			dev.NUMANode = ids[0]
		}
	}
	if dev.NUMANode < 0 {
		dev.NUMANode = sysfsNUMANode(dev.PCIBusID)
	}
	return dev, nil
}

// sysfsNUMANode reads /sys/bus/pci/devices/<bus id>/numa_node; -1 if unknown.
func sysfsNUMANode(bus string) int {
	b, err := os.ReadFile(filepath.Join("/sys/bus/pci/devices", BusIDKey(bus), "numa_node"))
	if err != nil {
		return -1
	}
	v, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return -1
	}
	return v
}

func (n *real) Sample(i int) (Sample, error) {
	d, err := n.handle(i)
	if err != nil {
		return Sample{}, err
	}
	s := Sample{GPUUtil: -1, MemUtil: -1, PowerW: -1, PowerLimitW: -1, TempC: -1, SlowdownTempC: -1, SMClockMHz: -1}
	m, r := d.GetMemoryInfo()
	if r != nvml.SUCCESS {
		return s, nvErr(fmt.Sprintf("GPU %d: nvmlDeviceGetMemoryInfo", i), r)
	}
	s.MemoryUsed, s.MemoryTotal = m.Used, m.Total
	// The v1 "used" counts the driver's reservation (about 600 MiB on an
	// H200); v2 splits it off, as nvidia-smi's memory.used does.
	if m2, r := d.GetMemoryInfo_v2(); r == nvml.SUCCESS {
		s.MemoryUsed, s.MemoryReserved = m2.Used, m2.Reserved
	}
	if u, r := d.GetUtilizationRates(); r == nvml.SUCCESS {
		s.GPUUtil, s.MemUtil = int(u.Gpu), int(u.Memory)
	}
	if p, r := d.GetPowerUsage(); r == nvml.SUCCESS {
		s.PowerW = float64(p) / 1000
	}
	if p, r := d.GetEnforcedPowerLimit(); r == nvml.SUCCESS {
		s.PowerLimitW = float64(p) / 1000
	}
	if t, r := d.GetTemperature(nvml.TEMPERATURE_GPU); r == nvml.SUCCESS {
		s.TempC = int(t)
	}
	if t, r := d.GetTemperatureThreshold(nvml.TEMPERATURE_THRESHOLD_SLOWDOWN); r == nvml.SUCCESS {
		s.SlowdownTempC = int(t)
	}
	if c, r := d.GetClockInfo(nvml.CLOCK_SM); r == nvml.SUCCESS {
		s.SMClockMHz = int(c)
	}
	if t, r := d.GetCurrentClocksEventReasons(); r == nvml.SUCCESS {
		s.Throttle = Throttle(t)
	} else if t, r := d.GetCurrentClocksThrottleReasons(); r == nvml.SUCCESS {
		s.Throttle = Throttle(t)
	}
	if g, r := d.GetCurrPcieLinkGeneration(); r == nvml.SUCCESS {
		s.PCIeGen = g
	}
	if g, r := d.GetMaxPcieLinkGeneration(); r == nvml.SUCCESS {
		s.PCIeMaxGen = g
	}
	if w, r := d.GetCurrPcieLinkWidth(); r == nvml.SUCCESS {
		s.PCIeWidth = w
	}
	if w, r := d.GetMaxPcieLinkWidth(); r == nvml.SUCCESS {
		s.PCIeMaxWidth = w
	}
	if cur, _, r := d.GetEccMode(); r == nvml.SUCCESS && cur == nvml.FEATURE_ENABLED {
		s.ECCEnabled = true
		if c, r := d.GetTotalEccErrors(nvml.MEMORY_ERROR_TYPE_CORRECTED, nvml.VOLATILE_ECC); r == nvml.SUCCESS {
			s.ECCCorrected = c
		}
		if c, r := d.GetTotalEccErrors(nvml.MEMORY_ERROR_TYPE_UNCORRECTED, nvml.VOLATILE_ECC); r == nvml.SUCCESS {
			s.ECCUncorrected = c
		}
	}
	return s, nil
}

func (n *real) NVLinks(i int) ([]NVLink, error) {
	d, err := n.handle(i)
	if err != nil {
		return nil, err
	}
	var links []NVLink
	for l := range nvml.NVLINK_MAX_LINKS {
		st, r := d.GetNvLinkState(l)
		if r == nvml.ERROR_NOT_SUPPORTED || r == nvml.ERROR_INVALID_ARGUMENT {
			continue // no such link on this GPU
		}
		if r != nvml.SUCCESS {
			if l == 0 {
				return nil, nil // NVML answers nothing about NVLink here
			}
			continue
		}
		link := NVLink{Link: l, Active: st == nvml.FEATURE_ENABLED}
		if link.Active {
			if pci, r := d.GetNvLinkRemotePciInfo(l); r == nvml.SUCCESS {
				link.RemotePCIBusID = busID(pci)
			}
			if t, r := d.GetNvLinkRemoteDeviceType(l); r == nvml.SUCCESS {
				link.RemoteIsSwitch = t == nvml.NVLINK_DEVICE_TYPE_SWITCH
			}
		}
		links = append(links, link)
	}
	return links, nil
}

func (n *real) CommonAncestor(i, j int) (Level, error) {
	a, err := n.handle(i)
	if err != nil {
		return 0, err
	}
	b, err := n.handle(j)
	if err != nil {
		return 0, err
	}
	lvl, r := a.GetTopologyCommonAncestor(b)
	return Level(lvl), nvErr(fmt.Sprintf("GPU %d and %d: nvmlDeviceGetTopologyCommonAncestor", i, j), r)
}

func (n *real) Processes(i int) ([]Process, error) {
	d, err := n.handle(i)
	if err != nil {
		return nil, err
	}
	seen := map[int]bool{}
	var out []Process
	var errs []error
	for _, q := range []struct {
		op string
		f  func() ([]nvml.ProcessInfo, nvml.Return)
	}{
		{"nvmlDeviceGetComputeRunningProcesses", d.GetComputeRunningProcesses},
		{"nvmlDeviceGetGraphicsRunningProcesses", d.GetGraphicsRunningProcesses},
	} {
		ps, r := q.f()
		if r != nvml.SUCCESS {
			if r != nvml.ERROR_NOT_SUPPORTED {
				errs = append(errs, nvErr(fmt.Sprintf("GPU %d: %s", i, q.op), r))
			}
			continue
		}
		for _, p := range ps {
			pid := int(p.Pid)
			if seen[pid] {
				continue
			}
			seen[pid] = true
			proc := Process{PID: pid}
			// NVML reports "not available" as all ones.
			if p.UsedGpuMemory != ^uint64(0) {
				proc.UsedMemory = p.UsedGpuMemory
			}
			if name, r := n.lib.SystemGetProcessName(pid); r == nvml.SUCCESS {
				proc.Name = name
			}
			out = append(out, proc)
		}
	}
	return out, errors.Join(errs...)
}

func (n *real) WatchXID() (XIDWatch, error) {
	set, r := n.lib.EventSetCreate()
	if err := nvErr("nvmlEventSetCreate", r); err != nil {
		return nil, err
	}
	w := &xidWatch{lib: n.lib, set: set, index: map[string]int{}}
	count, err := n.Count()
	if err != nil {
		set.Free()
		return nil, err
	}
	registered := 0
	var lastErr error
	for i := range count {
		d, err := n.handle(i)
		if err != nil {
			lastErr = err
			continue
		}
		if uuid, r := d.GetUUID(); r == nvml.SUCCESS {
			w.index[uuid] = i
		}
		if r := d.RegisterEvents(nvml.EventTypeXidCriticalError, set); r != nvml.SUCCESS {
			lastErr = nvErr(fmt.Sprintf("GPU %d: nvmlDeviceRegisterEvents", i), r)
			continue
		}
		registered++
	}
	if registered == 0 && count > 0 {
		set.Free()
		return nil, lastErr
	}
	return w, nil
}

type xidWatch struct {
	lib   nvml.Interface
	set   nvml.EventSet
	index map[string]int // UUID → GPU index
}

func (w *xidWatch) Wait(timeout time.Duration) ([]XID, error) {
	var out []XID
	ms := uint32(timeout / time.Millisecond)
	for {
		ev, r := w.set.Wait(ms)
		switch r {
		case nvml.SUCCESS:
		case nvml.ERROR_TIMEOUT:
			return out, nil
		default:
			return out, nvErr("nvmlEventSetWait", r)
		}
		x := XID{GPU: -1, Code: ev.EventData}
		if ev.Device != nil {
			if uuid, r := ev.Device.GetUUID(); r == nvml.SUCCESS {
				if i, ok := w.index[uuid]; ok {
					x.GPU = i
				}
			}
		}
		out = append(out, x)
		ms = 0 // then only what is already queued
	}
}

func (w *xidWatch) Close() error { return nvErr("nvmlEventSetFree", w.set.Free()) }

func (n *real) Close() error { return nvErr("nvmlShutdown", n.lib.Shutdown()) }
