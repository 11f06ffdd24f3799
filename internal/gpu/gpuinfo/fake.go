package gpuinfo

import (
	"fmt"
	"sync"
	"time"
)

// Fake is an NVML held in memory, for tests. Fill its fields, then use it;
// the methods read them under a lock, so a test may change them between
// calls with Update. Links between GPUs are given per GPU in NVLinks.
type Fake struct {
	mu sync.Mutex

	Driver     string // DriverVersion's answer
	CUDADriver int    // CUDADriverVersion's answer
	Devices    []Device
	Samples    []Sample         // by GPU; missing entries are zero samples
	Links      [][]NVLink       // by GPU
	Procs      [][]Process      // by GPU
	Ancestors  map[[2]int]Level // by (i, j) with i < j; missing pairs are LevelSystem
	XIDs       []XID            // what every XIDWatch receives on its first Wait
	Err        error            // when set, every call returns it
	closed     bool
}

var _ NVML = (*Fake)(nil)

// Update runs f with the Fake locked, to change its fields safely.
func (f *Fake) Update(fn func(f *Fake)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fn(f)
}

func (f *Fake) check(i int) error {
	if f.Err != nil {
		return f.Err
	}
	if i < 0 || i >= len(f.Devices) {
		return fmt.Errorf("gpuinfo: GPU %d: no such GPU (have %d)", i, len(f.Devices))
	}
	return nil
}

func (f *Fake) Count() (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.Devices), f.Err
}

func (f *Fake) DriverVersion() (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.Driver, f.Err
}

func (f *Fake) CUDADriverVersion() (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.CUDADriver, f.Err
}

func (f *Fake) Device(i int) (Device, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.check(i); err != nil {
		return Device{}, err
	}
	d := f.Devices[i]
	d.Index = i
	d.CPUs = append([]int(nil), d.CPUs...)
	return d, nil
}

func (f *Fake) Sample(i int) (Sample, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.check(i); err != nil {
		return Sample{}, err
	}
	if i < len(f.Samples) {
		return f.Samples[i], nil
	}
	return Sample{MemoryTotal: f.Devices[i].MemoryTotal}, nil
}

func (f *Fake) NVLinks(i int) ([]NVLink, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.check(i); err != nil {
		return nil, err
	}
	if i < len(f.Links) {
		return append([]NVLink(nil), f.Links[i]...), nil
	}
	return nil, nil
}

func (f *Fake) CommonAncestor(i, j int) (Level, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.check(i); err != nil {
		return 0, err
	}
	if err := f.check(j); err != nil {
		return 0, err
	}
	if i > j {
		i, j = j, i
	}
	if l, ok := f.Ancestors[[2]int{i, j}]; ok {
		return l, nil
	}
	return LevelSystem, nil
}

func (f *Fake) Processes(i int) ([]Process, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.check(i); err != nil {
		return nil, err
	}
	if i < len(f.Procs) {
		return append([]Process(nil), f.Procs[i]...), nil
	}
	return nil, nil
}

func (f *Fake) WatchXID() (XIDWatch, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.Err != nil {
		return nil, f.Err
	}
	return &fakeWatch{pending: append([]XID(nil), f.XIDs...)}, nil
}

func (f *Fake) Close() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.closed = true
	return nil
}

// Closed reports whether Close was called.
func (f *Fake) Closed() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.closed
}

type fakeWatch struct {
	mu      sync.Mutex
	pending []XID
}

func (w *fakeWatch) Wait(time.Duration) ([]XID, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := w.pending
	w.pending = nil
	return out, nil
}

func (w *fakeWatch) Close() error { return nil }

// NewFakeNVLinked returns a Fake of n healthy GPUs named name, every pair
// joined by links NVLinks (as on an NVSwitch system, or 2 GPUs with a
// bridge), all on NUMA node 0 with CPUs 0 to cpus-1: a model of the
// 2 × H200 machine with n = 2, links = 18.
func NewFakeNVLinked(n, links, cpus int, name string) *Fake {
	f := &Fake{Driver: "580.159.04", CUDADriver: 13000, Ancestors: map[[2]int]Level{}}
	all := make([]int, cpus)
	for c := range all {
		all[c] = c
	}
	const mem = 143771 << 20
	for i := range n {
		f.Devices = append(f.Devices, Device{
			Index: i, Name: name, UUID: fmt.Sprintf("GPU-00000000-0000-0000-0000-%012d", i),
			PCIBusID: fmt.Sprintf("00000000:%02X:00.0", 0x18+i), MemoryTotal: mem,
			NUMANode: 0, CPUs: all,
		})
		f.Samples = append(f.Samples, Sample{
			MemoryUsed: 0, MemoryReserved: 600 << 20, MemoryTotal: mem, GPUUtil: 0, MemUtil: 0,
			PowerW: 75, PowerLimitW: 700, TempC: 30, SlowdownTempC: 87, SMClockMHz: 1980,
			Throttle: ThrottleGPUIdle, ECCEnabled: true,
			PCIeGen: 5, PCIeMaxGen: 5, PCIeWidth: 16, PCIeMaxWidth: 16,
		})
	}
	for i := range n {
		var ls []NVLink
		l := 0
		for j := range n {
			if j == i || n == 1 {
				continue
			}
			// Spread the links over the peers; with more than 2 GPUs they
			// go to NVSwitches instead.
			if n == 2 {
				for range links {
					ls = append(ls, NVLink{Link: l, Active: true, RemotePCIBusID: f.Devices[j].PCIBusID})
					l++
				}
			}
		}
		if n > 2 {
			for range links {
				ls = append(ls, NVLink{Link: l, Active: true, RemotePCIBusID: fmt.Sprintf("00000000:%02X:00.0", 0xA0+l%4), RemoteIsSwitch: true})
				l++
			}
		}
		f.Links = append(f.Links, ls)
		for j := i + 1; j < n; j++ {
			f.Ancestors[[2]int{i, j}] = LevelSystem
		}
	}
	return f
}
