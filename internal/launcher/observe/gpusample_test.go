package observe

import (
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gotrain/gotrain/internal/gpu/gpuinfo"
	gotrainv1 "github.com/gotrain/gotrain/proto/gotrain/v1"
)

// fakeClock is a clock a test moves by hand.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// warnings collects the sampler's warnings.
type warnings struct {
	mu   sync.Mutex
	msgs []string
}

func (w *warnings) add(m string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.msgs = append(w.msgs, m)
}

func (w *warnings) take() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := w.msgs
	w.msgs = nil
	return out
}

// sampledRanks is telemetry of two ranks on GPUs 0 and 1 of fake (rank i
// on GPU i, as the hub names them), with a sampler on a fake clock.
func sampledRanks(t *testing.T, fake *gpuinfo.Fake) (*Telemetry, *GPUSampler, *fakeClock, *warnings) {
	t.Helper()
	clk := &fakeClock{t: time.Unix(1_800_000_000, 0)}
	warn := &warnings{}
	log := slog.New(slog.DiscardHandler)
	tel := NewTelemetry(clk.now)
	owner := func(gpu int) (int, bool) { return gpu, gpu == 0 || gpu == 1 }
	s := NewGPUSampler(fake, "host-a", clk.now, log, warn.add, owner)
	tel.GPUs = s
	tel.Started(0, 0)
	tel.Started(0, 1)
	return tel, s, clk, warn
}

// usedGPUs are the GPUs of sampledRanks' ranks.
func usedGPUs() []int { return []int{0, 1} }

func TestGPUSamplerThrottleWarning(t *testing.T) {
	fake := gpuinfo.NewFakeNVLinked(2, 18, 8, "NVIDIA H200")
	fake.Update(func(f *gpuinfo.Fake) {
		f.Samples[1].TempC = 92
		f.Samples[1].SMClockMHz = 1100
		f.Samples[1].Throttle = gpuinfo.ThrottleHwThermal | gpuinfo.ThrottleSwThermal
	})
	tel, s, clk, warn := sampledRanks(t, fake)

	s.sampleOnce(usedGPUs())
	got := warn.take()
	if len(got) != 1 {
		t.Fatalf("warnings = %q, want one about GPU 1", got)
	}
	for _, want := range []string{"GPU 1 (GPU-00000000-0000-0000-0000-000000000001) of rank 1 on host-a", "thermally throttled",
		"sw_thermal_slowdown,hw_thermal_slowdown", "92 °C", "slows down at 87 °C", "1100 MHz"} {
		if !strings.Contains(got[0], want) {
			t.Errorf("warning %q lacks %q", got[0], want)
		}
	}

	// Still throttled a second later: no new warning until throttleWarnEvery.
	for range 3 {
		clk.add(time.Second)
		s.sampleOnce(usedGPUs())
	}
	if got := warn.take(); len(got) != 0 {
		t.Errorf("warned again within %s: %q", throttleWarnEvery, got)
	}
	clk.add(throttleWarnEvery)
	s.sampleOnce(usedGPUs())
	if got := warn.take(); len(got) != 1 || !strings.Contains(got[0], "(3 more since the last warning)") {
		t.Errorf("after %s: warnings = %q, want one that counts the 3 held back", throttleWarnEvery, got)
	}

	// The samples go out with the ranks' progress (the hub's report).
	var ranks []*gotrainv1.RankProgress
	for r := range 2 {
		p := &gotrainv1.RankProgress{Rank: int32(r)}
		tel.Annotate(r, p, r)
		ranks = append(ranks, p)
	}
	g0, g1 := ranks[0].GetGpu(), ranks[1].GetGpu()
	if g0.GetIndex() != 0 || g0.GetTemperatureC() != 30 || g0.GetThrottleReasons() != uint64(gpuinfo.ThrottleGPUIdle) {
		t.Errorf("rank 0's GPU sample = %v", g0)
	}
	if g1.GetIndex() != 1 || g1.GetTemperatureC() != 92 || g1.GetSmClockMhz() != 1100 || g1.GetPowerLimitWatts() != 700 ||
		g1.GetMemoryTotalBytes() != 143771<<20 || g1.GetName() != "NVIDIA H200" || g1.GetUuid() == "" ||
		gpuinfo.Throttle(g1.GetThrottleReasons())&gpuinfo.ThrottleHwThermal == 0 || g1.GetUnixNanos() != clk.now().UnixNano() {
		t.Errorf("rank 1's GPU sample = %v", g1)
	}
}

func TestGPUSamplerPowerAndXID(t *testing.T) {
	fake := gpuinfo.NewFakeNVLinked(2, 18, 8, "NVIDIA H200")
	fake.Update(func(f *gpuinfo.Fake) {
		f.Samples[0].PowerW = 699
		f.Samples[0].Throttle = gpuinfo.ThrottleSwPowerCap
		f.XIDs = []gpuinfo.XID{{GPU: 1, Code: 79}, {GPU: 1, Code: 79}, {GPU: 3, Code: 13}}
	})
	_, s, _, warn := sampledRanks(t, fake)
	s.sampleOnce(usedGPUs())
	got := strings.Join(warn.take(), "\n")
	for _, want := range []string{
		"GPU 0 (GPU-00000000-0000-0000-0000-000000000000) of rank 0 on host-a is power throttled (sw_power_cap): 699 W of a 700 W limit",
		"XID 79 on GPU 1 (GPU-00000000-0000-0000-0000-000000000001) of rank 1 on host-a: the GPU has fallen off the bus",
		"XID 13 on GPU 3 on host-a (no rank of this job)",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("warnings lack %q:\n%s", want, got)
		}
	}
	if n := strings.Count(got, "XID 79"); n != 1 {
		t.Errorf("XID 79 warned %d times in one second, want once:\n%s", n, got)
	}
	p := s.sample(1)
	if p.GetXidErrors() != 2 || p.GetLastXid() != 79 {
		t.Errorf("GPU 1 sample: %d XID errors, last %d; want 2 and 79", p.GetXidErrors(), p.GetLastXid())
	}
	if strings.Contains(got, "thermal") {
		t.Errorf("a power-capped GPU was called thermally throttled:\n%s", got)
	}
}

func TestStepRate(t *testing.T) {
	clk := &fakeClock{t: time.Unix(1_800_000_000, 0)}
	tel := NewTelemetry(clk.now)
	tel.Started(2, 0)
	start := clk.now()
	report := func(step, done int64) *gotrainv1.RankProgress {
		p := &gotrainv1.RankProgress{Rank: 0, Generation: 2, Step: step, Attached: true,
			Comms: []*gotrainv1.CommProgress{{Comm: "c", CompletedSeq: done}}}
		tel.Observe(0, p)
		out := &gotrainv1.RankProgress{Rank: 0, Generation: 2, Attached: true}
		tel.Annotate(0, out, -1)
		return out
	}
	if p := report(0, 0); p.GetProgressUnixNanos() != start.UnixNano() || p.GetStepsPerSecond() != 0 {
		t.Errorf("before any step: %v", p)
	}
	// 5 steps a second for 4 seconds.
	var p *gotrainv1.RankProgress
	for i := 1; i <= 4; i++ {
		clk.add(time.Second)
		p = report(int64(5*i), int64(5*i))
	}
	if r := p.GetStepsPerSecond(); r != 5 {
		t.Errorf("steps/s = %v, want 5", r)
	}
	if p.GetProgressUnixNanos() != clk.now().UnixNano() {
		t.Errorf("progress time %d, want now %d", p.GetProgressUnixNanos(), clk.now().UnixNano())
	}
	// Only collectives move: progress, no new step.
	clk.add(time.Second)
	if p = report(20, 21); p.GetProgressUnixNanos() != clk.now().UnixNano() {
		t.Errorf("a completed collective is progress: %v", p)
	}
	moved := clk.now()
	// Stalled: the rate falls, the progress time stays.
	clk.add(3 * time.Second)
	p = report(20, 21)
	if r := p.GetStepsPerSecond(); r <= 0 || r >= 5 {
		t.Errorf("stalled 3s: steps/s = %v, want between 0 and 5", r)
	}
	if p.GetProgressUnixNanos() != moved.UnixNano() {
		t.Errorf("stalled: progress time moved")
	}
	clk.add(2 * stepWindow)
	if p = report(20, 21); p.GetStepsPerSecond() != 0 {
		t.Errorf("stalled for %s: steps/s = %v, want 0", 2*stepWindow, p.GetStepsPerSecond())
	}
	// A program that does not attach has no known progress.
	un := &gotrainv1.RankProgress{Rank: 0, Generation: 2}
	tel.Annotate(0, un, -1)
	if un.GetProgressUnixNanos() != 0 {
		t.Errorf("unattached rank got a progress time")
	}
	var nilTel *Telemetry
	nilTel.Started(0, 0)
	nilTel.Observe(0, p)
	nilTel.Annotate(0, p, 0) // a nil telemetry does nothing
}
