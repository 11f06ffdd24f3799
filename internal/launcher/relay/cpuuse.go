package relay

import (
	"strconv"
	"time"

	"github.com/gotrain/gotrain/internal/procstat"
)

// A rank's CPU use between two progress reports, from the CPU time
// /proc/PID/stat counts (its threads; not its children, such as DataLoader
// workers, until they are reaped): with its GPU's utilisation and its
// step rate it tells a rank busy feeding its GPU from one that waits.

// clockTicks is USER_HZ, the unit of /proc/PID/stat's times: 100 on every
// Linux architecture gotrain runs on.
const clockTicks = 100

// cpuSample is a process's CPU time at a moment.
type cpuSample struct {
	pid   int
	ticks int64 // -1: unknown
	at    time.Time
}

// next takes process pid's CPU time ticks (-1: unknown) at now and returns
// its CPU use since the previous sample, in percent of one CPU; false when
// there is no previous sample of the same process.
func (c *cpuSample) next(pid int, ticks int64, now time.Time) (float64, bool) {
	prev := *c
	*c = cpuSample{pid: pid, ticks: ticks, at: now}
	dt := now.Sub(prev.at).Seconds()
	if prev.pid != pid || prev.ticks < 0 || ticks < prev.ticks || dt <= 0 || prev.at.IsZero() || ticks < 0 {
		return 0, false
	}
	return float64(ticks-prev.ticks) / clockTicks / dt * 100, true
}

// cpuTicks reads process pid's user and system CPU time in clock ticks;
// -1 when it cannot.
func cpuTicks(pid int) int64 {
	f := procstat.Fields(pid) // from the state on: utime and stime are fields 14 and 15
	if len(f) < 13 {
		return -1
	}
	u, err1 := strconv.ParseInt(f[11], 10, 64)
	s, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return -1
	}
	return u + s
}
