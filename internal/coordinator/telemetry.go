package coordinator

import (
	"github.com/gotrain/gotrain/internal/coordinator/job"
	gotrainv1 "github.com/gotrain/gotrain/proto/gotrain/v1"
)

// Telemetry the agents add to their ranks' progress (GPU samples, step
// rates, last progress times), converted between wire and machine types;
// convert.go calls these.

func telemetryToProto(out *gotrainv1.RankProgress, p *job.Progress) {
	out.StepsPerSecond = p.StepsPerSecond
	out.ProgressUnixNanos = unixNanos(p.Advanced)
	if p.CPUKnown {
		cpu := p.CPUPercent
		out.CpuPercent = &cpu
	}
	g := p.GPU
	if g.Time.IsZero() {
		return
	}
	out.Gpu = &gotrainv1.GPUSample{
		Index: int32(g.Index), Uuid: g.UUID, Name: g.Name, UnixNanos: g.Time.UnixNano(),
		UtilPercent: int32(g.UtilPercent), MemoryUsedBytes: g.MemoryUsed, MemoryTotalBytes: g.MemoryTotal,
		PowerWatts: g.PowerW, PowerLimitWatts: g.PowerLimitW,
		TemperatureC: int32(g.TempC), SlowdownTemperatureC: int32(g.SlowdownTempC), SmClockMhz: int32(g.SMClockMHz),
		ThrottleReasons: g.ThrottleReasons, XidErrors: g.XIDErrors, LastXid: g.LastXID,
	}
}
