package observe

import (
	"time"

	gotrainv1 "github.com/gotrain/gotrain/proto/gotrain/v1"
)

// Telemetry is what the agent adds to each rank's progress before it goes to
// the coordinator: the latest sample of the rank's GPU, the rank's step rate
// over the last stepWindow, and when the rank last advanced (its step or a
// completed collective moved). The hub calls it with hub.mu held; a nil
// *Telemetry does nothing.
type Telemetry struct {
	now   func() time.Time
	GPUs  *GPUSampler // nil: no NVML, no GPU samples
	ranks map[int]*advance
}

// stepWindow is how far back the step rate looks.
const stepWindow = 10 * time.Second

// advance is one rank's movement.
type advance struct {
	gen   int64
	step  int64
	done  int64     // completed collectives, summed over communicators
	moved time.Time // when step or done last grew, or when the rank started
	obs   []stepObs // steps seen within stepWindow, oldest first
}

type stepObs struct {
	at   time.Time
	step int64
}

func NewTelemetry(now func() time.Time) *Telemetry {
	return &Telemetry{now: now, ranks: map[int]*advance{}}
}

// Started records that rank's process of generation gen started.
func (t *Telemetry) Started(gen int64, rank int) {
	if t == nil {
		return
	}
	t.ranks[rank] = &advance{gen: gen, moved: t.now()}
}

// Observe takes a progress report of rank.
func (t *Telemetry) Observe(rank int, p *gotrainv1.RankProgress) {
	if t == nil {
		return
	}
	now := t.now()
	a := t.ranks[rank]
	if a == nil || a.gen != p.GetGeneration() {
		a = &advance{gen: p.GetGeneration(), moved: now}
		t.ranks[rank] = a
	}
	var done int64
	for _, c := range p.GetComms() {
		done += c.GetCompletedSeq()
	}
	step := p.GetStep()
	if step < a.step || done < a.done {
		// A new communicator or a restarted count: start over.
		a.obs = nil
	}
	if step > a.step || done > a.done {
		a.moved = now
	}
	a.step, a.done = step, done
	if step > 0 && (len(a.obs) == 0 || a.obs[len(a.obs)-1].step != step) {
		a.obs = append(a.obs, stepObs{at: now, step: step})
	}
}

// Annotate adds the rank's GPU sample, step rate and last advance to p.
func (t *Telemetry) Annotate(rank int, p *gotrainv1.RankProgress, gpu int) {
	if t == nil {
		return
	}
	p.Gpu = t.GPUs.sample(gpu)
	a := t.ranks[rank]
	if (!p.GetAttached() && p.GetStepSource() == "") || a == nil || a.gen != p.GetGeneration() {
		// A program that does not report its progress: unknown.
		return
	}
	now := t.now()
	p.ProgressUnixNanos = a.moved.UnixNano()
	p.StepsPerSecond = a.rate(now)
}

// rate is the steps per second over about the last stepWindow: from the
// newest step seen before the window (or the oldest in it) to the newest
// step, over the time from the first of them to now, so that a rank that
// stops slows down towards 0.
func (a *advance) rate(now time.Time) float64 {
	i := 0
	for i < len(a.obs)-1 && now.Sub(a.obs[i+1].at) > stepWindow {
		i++
	}
	a.obs = a.obs[i:]
	if len(a.obs) < 2 {
		return 0
	}
	first, last := a.obs[0], a.obs[len(a.obs)-1]
	d := now.Sub(first.at).Seconds()
	if d <= 0 {
		return 0
	}
	return float64(last.step-first.step) / d
}
