package job

import (
	"strings"
	"testing"
	"time"
)

func TestStragglerGPUCause(t *testing.T) {
	at := time.Unix(100, 0)
	s := func(reasons uint64, temp int) GPUSample {
		return GPUSample{Index: 2, Time: at, TempC: temp, SlowdownTempC: 87, SMClockMHz: 1410, PowerW: 690, PowerLimitW: 700, ThrottleReasons: reasons}
	}
	cool := s(0, 60)
	for _, tc := range []struct {
		name  string
		g     GPUSample
		peers []GPUSample
		want  string // part of the answer; "" for none
	}{
		{"healthy", cool, []GPUSample{cool}, ""},
		{"no sample", GPUSample{}, nil, ""},
		{"hardware thermal", s(throttleHWThermal, 91), []GPUSample{cool}, "likely cause: its GPU 2 is thermally throttled: 91 °C (slows down at 87 °C), SM clock 1410 MHz; check its cooling"},
		{"software thermal", s(throttleSWThermal, 84), []GPUSample{cool}, "thermally throttled: 84 °C"},
		{"at the slowdown temperature, no reason yet", s(0, 87), []GPUSample{cool}, "thermally throttled"},
		{"thermal even when the peers are hot too", s(throttleHWThermal, 91), []GPUSample{s(throttleHWThermal, 90)}, "thermally throttled"},
		{"power, peers not", s(throttleSWPowerCap, 70), []GPUSample{cool, cool, s(throttleSWPowerCap, 60)}, "power throttled: 690 W of a 700 W limit, SM clock 1410 MHz, while its peers' are not"},
		{"power brake", s(throttleHWPowerBrake, 70), []GPUSample{cool}, "power throttled"},
		{"power, like most peers", s(throttleSWPowerCap, 70), []GPUSample{s(throttleSWPowerCap, 60), s(throttleSWPowerCap, 61), cool}, ""},
		{"power, peers unsampled", s(throttleSWPowerCap, 70), []GPUSample{{}}, "power throttled"},
		{"idle and sync boost are not causes", s(0x1|0x10|0x2, 60), []GPUSample{cool}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := stragglerGPUCause(tc.g, tc.peers)
			if (got == "") != (tc.want == "") || !strings.Contains(got, tc.want) {
				t.Errorf("stragglerGPUCause = %q, want %q", got, tc.want)
			}
		})
	}
}

// The machine compares the straggler's latest sample with the other ranks'.
func TestStragglerCauseFromRanks(t *testing.T) {
	at := time.Unix(100, 0)
	capped := GPUSample{Index: 1, Time: at, ThrottleReasons: throttleSWPowerCap, PowerW: 700, PowerLimitW: 700}
	m := &Machine{ranks: []rank{
		{progress: &Progress{GPU: GPUSample{Index: 0, Time: at}}},
		{progress: &Progress{GPU: capped}},
		{progress: &Progress{GPU: GPUSample{Index: 2, Time: at}}},
		{},
	}}
	if got := m.stragglerCause(1); !strings.Contains(got, "its GPU 1 is power throttled") {
		t.Errorf("stragglerCause(1) = %q", got)
	}
	for _, r := range []int{0, 3, 7, -1} {
		if got := m.stragglerCause(r); got != "" {
			t.Errorf("stragglerCause(%d) = %q, want none", r, got)
		}
	}
}
