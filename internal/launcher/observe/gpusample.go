package observe

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/gotrain/gotrain/internal/gpu/gpuinfo"
	gotrainv1 "github.com/gotrain/gotrain/proto/gotrain/v1"
)

// GPU sampling: once a second the agent asks NVML about every GPU its ranks
// use (utilisation, memory, power, temperature, SM clock, throttle reasons)
// and drains the driver's XID events. The latest sample of a rank's GPU goes
// out with the rank's progress (the relay's Hub.batch), so the coordinator, `gotrain top`
// and /metrics see it. Thermal or power throttling and XID errors are
// printed as warnings naming the rank, host and GPU, at most once per
// throttleWarnEvery (throttling) or xidWarnEvery (per XID code) for each GPU.
// Without NVML (no driver) the sampler is off and ranks carry no GPU sample.

const (
	// sampleEvery is how often the GPUs are sampled.
	sampleEvery = time.Second
	// throttleWarnEvery is how often a GPU that stays throttled for one
	// reason is warned about again.
	throttleWarnEvery = 5 * time.Minute
	// xidWarnEvery is how often one XID code of one GPU is warned about.
	xidWarnEvery = time.Minute
)

// GPUSampler samples GPUs through an injected NVML.
type GPUSampler struct {
	nv    gpuinfo.NVML
	host  string
	now   func() time.Time
	log   *slog.Logger
	warn  func(msg string) // prints one warning line for people
	owner func(gpu int) (rank int, ok bool)

	mu         sync.Mutex
	devices    map[int]gpuinfo.Device // identity, read once per GPU
	latest     map[int]*gotrainv1.GPUSample
	xids       map[int]uint64 // XID errors seen per GPU
	lastXID    map[int]uint64
	lastWarn   map[string]time.Time // by warning key
	suppressed map[string]int       // warnings held back since the last one, by key
	watch      gpuinfo.XIDWatch     // nil when NVML gives no XID events
}

// NewGPUSampler returns a sampler of nv's GPUs. owner names the rank that
// uses a GPU; warn prints a warning.
func NewGPUSampler(nv gpuinfo.NVML, host string, now func() time.Time, log *slog.Logger, warn func(string), owner func(int) (int, bool)) *GPUSampler {
	s := &GPUSampler{nv: nv, host: host, now: now, log: log, warn: warn, owner: owner,
		devices: map[int]gpuinfo.Device{}, latest: map[int]*gotrainv1.GPUSample{},
		xids: map[int]uint64{}, lastXID: map[int]uint64{},
		lastWarn: map[string]time.Time{}, suppressed: map[string]int{}}
	if w, err := nv.WatchXID(); err == nil {
		s.watch = w
	} else {
		log.Info("no XID events from NVML", "err", err)
	}
	return s
}

// Run samples gpus() every sampleEvery until ctx ends.
func (s *GPUSampler) Run(ctx context.Context, gpus func() []int) {
	t := time.NewTicker(sampleEvery)
	defer t.Stop()
	defer s.close()
	for {
		s.sampleOnce(gpus())
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (s *GPUSampler) close() {
	if s.watch != nil {
		_ = s.watch.Close()
	}
}

// sampleOnce samples the given GPUs and takes the XID events queued.
func (s *GPUSampler) sampleOnce(gpus []int) {
	now := s.now()
	if s.watch != nil {
		xids, err := s.watch.Wait(0)
		if err != nil {
			s.log.Debug("XID events", "err", err)
		}
		for _, x := range xids {
			s.xid(now, x)
		}
	}
	for _, g := range gpus {
		if g < 0 {
			continue
		}
		smp, err := s.nv.Sample(g)
		if err != nil {
			s.log.Debug("sample GPU", "gpu", g, "err", err)
			continue
		}
		dev, _ := s.device(g)
		p := &gotrainv1.GPUSample{
			Index: int32(g), Uuid: dev.UUID, Name: dev.Name, UnixNanos: now.UnixNano(),
			UtilPercent: int32(smp.GPUUtil), MemoryUsedBytes: smp.MemoryUsed, MemoryTotalBytes: smp.MemoryTotal,
			PowerWatts: smp.PowerW, PowerLimitWatts: smp.PowerLimitW,
			TemperatureC: int32(smp.TempC), SlowdownTemperatureC: int32(smp.SlowdownTempC),
			SmClockMhz: int32(smp.SMClockMHz), ThrottleReasons: uint64(smp.Throttle),
		}
		s.mu.Lock()
		p.XidErrors, p.LastXid = s.xids[g], s.lastXID[g]
		s.latest[g] = p
		s.mu.Unlock()
		s.checkThrottle(now, g, smp)
	}
}

// device returns GPU gpu's identity, asking NVML once.
func (s *GPUSampler) device(gpu int) (gpuinfo.Device, bool) {
	s.mu.Lock()
	dev, ok := s.devices[gpu]
	s.mu.Unlock()
	if ok || gpu < 0 {
		return dev, ok
	}
	dev, err := s.nv.Device(gpu)
	if err != nil {
		return dev, false
	}
	s.mu.Lock()
	s.devices[gpu] = dev
	s.mu.Unlock()
	return dev, true
}

// sample returns the latest sample of GPU gpu, nil if none.
func (s *GPUSampler) sample(gpu int) *gotrainv1.GPUSample {
	if s == nil || gpu < 0 {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if p := s.latest[gpu]; p != nil {
		return proto.CloneOf(p)
	}
	return nil
}

// checkThrottle warns when the GPU's clocks are held down by heat or by its
// power limit.
func (s *GPUSampler) checkThrottle(now time.Time, gpu int, smp gpuinfo.Sample) {
	thermal := smp.Throttle & gpuinfo.ThrottleThermal
	power := smp.Throttle & gpuinfo.ThrottlePower
	// hw_slowdown is heat or a power brake: the temperature tells which.
	if hw := smp.Throttle & gpuinfo.ThrottleHwSlowdown; hw != 0 {
		if smp.SlowdownTempC > 0 && smp.TempC >= smp.SlowdownTempC {
			thermal |= hw
		} else {
			power |= hw
		}
	}
	if thermal != 0 {
		s.warnLimited(now, fmt.Sprintf("thermal/%d", gpu), throttleWarnEvery, func() string {
			return fmt.Sprintf("%s is thermally throttled (%s): %d °C (slows down at %s), SM clock %d MHz; check its cooling and airflow",
				s.who(gpu), thermal, smp.TempC, orNA(smp.SlowdownTempC, "%d °C"), smp.SMClockMHz)
		})
	}
	if power != 0 {
		s.warnLimited(now, fmt.Sprintf("power/%d", gpu), throttleWarnEvery, func() string {
			return fmt.Sprintf("%s is power throttled (%s): %.0f W of a %.0f W limit, SM clock %d MHz; expected at full load, else check `nvidia-smi -q -d POWER`",
				s.who(gpu), power, smp.PowerW, smp.PowerLimitW, smp.SMClockMHz)
		})
	}
}

// xid records an XID error and warns about it.
func (s *GPUSampler) xid(now time.Time, x gpuinfo.XID) {
	s.mu.Lock()
	s.xids[x.GPU]++
	s.lastXID[x.GPU] = x.Code
	if p := s.latest[x.GPU]; p != nil {
		p.XidErrors, p.LastXid = s.xids[x.GPU], x.Code
	}
	s.mu.Unlock()
	s.warnLimited(now, fmt.Sprintf("xid/%d/%d", x.GPU, x.Code), xidWarnEvery, func() string {
		msg := fmt.Sprintf("XID %d on %s", x.Code, s.who(x.GPU))
		if m := xidMeaning(x.Code); m != "" {
			msg += ": " + m
		}
		return msg + "; see `dmesg | grep -i xid` and NVIDIA's XID catalog"
	})
}

// warnLimited prints the warning msg() unless key was warned about within
// every; warnings held back are counted and mentioned in the next one.
func (s *GPUSampler) warnLimited(now time.Time, key string, every time.Duration, msg func() string) {
	s.mu.Lock()
	last, seen := s.lastWarn[key]
	if seen && now.Sub(last) < every {
		s.suppressed[key]++
		s.mu.Unlock()
		return
	}
	held := s.suppressed[key]
	s.lastWarn[key], s.suppressed[key] = now, 0
	s.mu.Unlock()
	m := msg()
	if held > 0 {
		m += fmt.Sprintf(" (%d more since the last warning)", held)
	}
	s.warn(m)
}

// who names a GPU for people: rank, host, GPU index and UUID.
func (s *GPUSampler) who(gpu int) string {
	dev, ok := s.device(gpu)
	name := fmt.Sprintf("GPU %d", gpu)
	if gpu < 0 {
		name = "an unknown GPU"
	}
	if ok && dev.UUID != "" {
		name += " (" + dev.UUID + ")"
	}
	if r, ok := s.owner(gpu); ok {
		return fmt.Sprintf("%s of rank %d on %s", name, r, s.host)
	}
	return fmt.Sprintf("%s on %s (no rank of this job)", name, s.host)
}

func orNA(v int, format string) string {
	if v < 0 {
		return "N/A"
	}
	return fmt.Sprintf(format, v)
}

// xidMeaning says in a few words what common XID codes mean (NVIDIA's XID
// catalog); "" for the others.
func xidMeaning(code uint64) string {
	switch code {
	case 13:
		return "graphics engine exception (often a bug or bad memory access in a kernel)"
	case 31:
		return "GPU memory page fault (an illegal address in a kernel)"
	case 43:
		return "GPU stopped processing (a kernel was killed)"
	case 45:
		return "preemptive cleanup after a fault"
	case 48:
		return "double-bit ECC error: drain the node and reset the GPU"
	case 61, 62:
		return "internal micro-controller error: reset the GPU"
	case 63, 64:
		return "ECC page retirement or row remapping event"
	case 74:
		return "NVLink error"
	case 79:
		return "the GPU has fallen off the bus: drain the node"
	case 92:
		return "high single-bit ECC error rate"
	case 94:
		return "contained ECC error: restart the affected processes"
	case 95:
		return "uncontained ECC error: reset the GPU"
	case 119, 120:
		return "GSP firmware error: reset the GPU"
	}
	return ""
}
