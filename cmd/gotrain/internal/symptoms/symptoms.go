// Package symptoms names two of the field guide's classic failures from a
// running job's latest figures: a rank whose GPU sits idle while its peers'
// are busy (a silent fallback to the CPU), and a job whose GPUs are mostly
// idle while its ranks keep a CPU busy between steps (input-bound). It is
// pure: `gotrain top` and `gotrain diagnose` pass the ranks as the
// coordinator's status has them (FromStatus) and print what it finds.
//
// The figures are one moment's: each rank's GPU utilisation over NVML's
// last sample period and its process's CPU use over the last report
// interval (its own threads: DataLoader worker processes are not counted).
// A finding is a hint to look, not a verdict.
package symptoms

import (
	"fmt"
	"slices"

	gotrainv1 "github.com/gotrain/gotrain/proto/gotrain/v1"
)

// Rank is what the findings are made of, for one rank.
type Rank struct {
	Rank int
	Host string
	// GPU is the rank's GPU index, -1 for none; GPUUtil its utilisation
	// in percent, -1 when not sampled (no driver).
	GPU, GPUUtil int
	// CPUPercent is its process's CPU use in percent of one CPU, when
	// CPUKnown.
	CPUPercent float64
	CPUKnown   bool
	// StepsPerSecond is its step rate, 0 when unknown or stopped.
	StepsPerSecond float64
}

// Finding is one symptom found.
type Finding struct {
	// Kind is "cpu-fallback" or "input-bound".
	Kind string
	// Rank is the rank it is about, -1 for the whole job.
	Rank int
	// Text says it for people: what was seen, the likely cause, what to do.
	Text string
}

// Thresholds, in percent.
const (
	// idleGPU is a GPU doing nothing; busyGPU one at work.
	idleGPU = 2
	busyGPU = 30
	// mostlyIdleGPU is a median GPU utilisation that leaves the GPUs
	// waiting most of the time.
	mostlyIdleGPU = 40
	// busyCPU is a rank's process keeping most of one CPU busy.
	busyCPU = 80
)

// Find names the symptoms the ranks' figures show.
func Find(ranks []Rank) []Finding {
	var out []Finding
	var sampled []Rank
	for _, r := range ranks {
		if r.GPU >= 0 && r.GPUUtil >= 0 {
			sampled = append(sampled, r)
		}
	}
	// An idle GPU among busy ones: that rank computes elsewhere.
	if len(sampled) >= 2 {
		for _, r := range sampled {
			if r.GPUUtil > idleGPU {
				continue
			}
			var others []float64
			for _, o := range sampled {
				if o.Rank != r.Rank {
					others = append(others, float64(o.GPUUtil))
				}
			}
			if m := median(others); m >= busyGPU {
				cpu := ""
				if r.CPUKnown {
					cpu = fmt.Sprintf(", its process at %.0f %% of a CPU", r.CPUPercent)
				}
				out = append(out, Finding{Kind: "cpu-fallback", Rank: r.Rank, Text: fmt.Sprintf(
					"rank %d on %s: its GPU %d is idle (%d %%) while the other ranks' are busy (median %.0f %%)%s: it may be computing on the CPU. "+
						"Check in its environment that torch.cuda.is_available() is true (a CPU-only wheel, a driver it cannot use) and that CUDA_VISIBLE_DEVICES shows it its GPU, and that its model and tensors are moved to it",
					r.Rank, r.Host, r.GPU, r.GPUUtil, m, cpu)})
			}
		}
	}
	// GPUs mostly idle while the ranks step and keep a CPU busy: they wait
	// for their input.
	var util, cpu, rate []float64
	for _, r := range sampled {
		if r.StepsPerSecond > 0 && r.CPUKnown {
			util, cpu, rate = append(util, float64(r.GPUUtil)), append(cpu, r.CPUPercent), append(rate, r.StepsPerSecond)
		}
	}
	if len(util) > 0 && len(util)*2 >= len(sampled) {
		if mu, mc := median(util), median(cpu); mu < mostlyIdleGPU && mc >= busyCPU {
			out = append(out, Finding{Kind: "input-bound", Rank: -1, Text: fmt.Sprintf(
				"the job looks input-bound: its GPUs are mostly idle (median %.0f %% busy) while its ranks keep a CPU busy (median %.0f %%) at %.2f steps/s: "+
					"the GPUs wait for data. Give the DataLoader more num_workers, pin_memory=True and a prefetch_factor, or put the data on faster storage",
				mu, mc, median(rate))})
		}
	}
	return out
}

// median of xs, 0 for none.
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if n := len(s); n%2 == 0 {
		return (s[n/2-1] + s[n/2]) / 2
	}
	return s[len(s)/2]
}

// FromStatus takes the running ranks' figures from a job's status.
func FromStatus(st *gotrainv1.JobStatus) []Rank {
	var out []Rank
	for _, r := range st.GetRanks() {
		if r.GetState() != "running" {
			continue
		}
		p := r.GetProgress()
		rk := Rank{Rank: int(r.GetRank()), Host: r.GetHostname(), GPU: int(r.GetGpu()), GPUUtil: -1, StepsPerSecond: p.GetStepsPerSecond()}
		if g := p.GetGpu(); g != nil && g.GetUnixNanos() != 0 {
			rk.GPUUtil = int(g.GetUtilPercent())
		}
		if p != nil && p.CpuPercent != nil {
			rk.CPUPercent, rk.CPUKnown = p.GetCpuPercent(), true
		}
		out = append(out, rk)
	}
	return out
}
