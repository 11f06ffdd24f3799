package job

import "fmt"

// NVML's clock event reasons (nvmlClocksEventReason*), as GPUSample's
// ThrottleReasons carries them: the ones that slow a GPU below what it
// could run at. Idle, application clocks and sync boost are not causes.
const (
	throttleSWPowerCap   = 0x4
	throttleHWSlowdown   = 0x8
	throttleSWThermal    = 0x20
	throttleHWThermal    = 0x40
	throttleHWPowerBrake = 0x80

	throttleThermal = throttleSWThermal | throttleHWThermal
	throttlePower   = throttleSWPowerCap | throttleHWPowerBrake | throttleHWSlowdown
)

// stragglerGPUCause says what in the straggler's GPU sample g explains it:
// thermal throttling, or power throttling that most of its peers' GPUs
// (peers, their samples) do not share (at full load every GPU may sit at
// its power cap); "" when nothing does or there is no sample. A link
// running below its width or generation is not in the sample.
func stragglerGPUCause(g GPUSample, peers []GPUSample) string {
	if g.Time.IsZero() {
		return ""
	}
	hot := g.SlowdownTempC > 0 && g.TempC >= g.SlowdownTempC
	if g.ThrottleReasons&throttleThermal != 0 || hot {
		return fmt.Sprintf("likely cause: its GPU %d is thermally throttled: %d °C (slows down at %s), SM clock %d MHz; check its cooling and airflow",
			g.Index, g.TempC, tempOrUnknown(g.SlowdownTempC), g.SMClockMHz)
	}
	if g.ThrottleReasons&throttlePower == 0 {
		return ""
	}
	sampled, capped := 0, 0
	for _, p := range peers {
		if p.Time.IsZero() {
			continue
		}
		sampled++
		if p.ThrottleReasons&throttlePower != 0 {
			capped++
		}
	}
	if sampled > 0 && capped*2 >= sampled {
		return "" // the others are held at their power cap too
	}
	return fmt.Sprintf("likely cause: its GPU %d is power throttled: %.0f W of a %.0f W limit, SM clock %d MHz, while its peers' are not; check its power limit and supply (nvidia-smi -q -d POWER)",
		g.Index, g.PowerW, g.PowerLimitW, g.SMClockMHz)
}

func tempOrUnknown(c int) string {
	if c <= 0 {
		return "an unknown temperature"
	}
	return fmt.Sprintf("%d °C", c)
}

// stragglerCause is stragglerGPUCause of rank's latest sample against the
// other ranks'.
func (m *Machine) stragglerCause(rank int) string {
	if rank < 0 || rank >= len(m.ranks) || m.ranks[rank].progress == nil {
		return ""
	}
	var peers []GPUSample
	for i, r := range m.ranks {
		if i != rank && r.progress != nil {
			peers = append(peers, r.progress.GPU)
		}
	}
	return stragglerGPUCause(m.ranks[rank].progress.GPU, peers)
}
