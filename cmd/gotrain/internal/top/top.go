// Package top turns a job's status (the coordinator's GetJobStatus) into
// what `gotrain top` shows: one row per rank with its GPU's state and its
// progress, the slowest rank first, as a table for people or as stable JSON
// for scripts. It is pure: the caller fetches the status and passes the
// time.
//
// # Usage
//
//	st, _ := client.GetJobStatus(ctx, &gotrainv1.GetJobStatusRequest{})
//	snap := top.Build(st, time.Now())
//	snap.WriteTable(os.Stdout) // or json.Marshal(snap)
//
// Slowest first means: the longest time since the rank last advanced (its
// step or a collective moved), counted in whole seconds so that reports a
// fraction of a second apart do not reorder healthy ranks; then the lowest
// step rate; then the rank. Ranks whose progress is unknown (programs that
// do not use the worker library) come last.
package top

import (
	"cmp"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/gotrain/gotrain/cmd/gotrain/internal/symptoms"
	"github.com/gotrain/gotrain/internal/gpu/gpuinfo"
	gotrainv1 "github.com/gotrain/gotrain/proto/gotrain/v1"
)

// Snapshot is the job at one moment. Its JSON form is stable: fields are
// only ever added.
type Snapshot struct {
	RunID        string `json:"run_id"`
	State        string `json:"state"`
	Generation   int64  `json:"generation"`
	WorldSize    int    `json:"world_size"`
	RestartCount int    `json:"restart_count"`
	// Time is when the snapshot was taken (RFC 3339, UTC).
	Time  string `json:"time"`
	Ranks []Rank `json:"ranks"`
	// Findings are the symptoms the ranks' figures show (package
	// symptoms): a rank that seems to compute on the CPU, an input-bound
	// job.
	Findings []Finding `json:"findings"`
}

// Finding is one symptom: its kind ("cpu-fallback", "input-bound"), the
// rank it is about (-1: the job) and what to do, for people.
type Finding struct {
	Kind string `json:"kind"`
	Rank int    `json:"rank"`
	Text string `json:"text"`
}

// Rank is one rank's row.
type Rank struct {
	Rank int    `json:"rank"`
	Host string `json:"host"`
	// GPU is the GPU's index on its node, -1 for none.
	GPU int `json:"gpu"`
	// State is the rank's state in the job: "running", "exited", "failed", ...
	State string `json:"state"`
	PID   int    `json:"pid"`
	// ProcessState is the process's /proc state letter, "" when unknown.
	ProcessState string `json:"process_state"`
	// Attached: the program reports its progress (the worker library).
	Attached bool `json:"attached"`
	// StepSource is "torch-hook" when Step counts the optimizer steps of a
	// PyTorch rank (gotrain's hook), "" otherwise; the step columns are
	// known when Attached or StepSource is set.
	StepSource       string  `json:"step_source"`
	Step             int64   `json:"step"`
	StepsPerSecond   float64 `json:"steps_per_second"`
	SamplesPerSecond float64 `json:"samples_per_second"`
	// CPUPercent is the rank's process's CPU use lately, in percent of one
	// CPU; null when unknown.
	CPUPercent *float64 `json:"cpu_percent"`
	// SinceProgressSeconds is how long ago the rank last advanced; null
	// when unknown.
	SinceProgressSeconds *float64 `json:"since_progress_seconds"`
	// LastCollective is the collective the rank waits in, else the last it
	// completed; null when it ran none.
	LastCollective *Collective `json:"last_collective"`
	// GPUSample is the rank's GPU as last sampled; null without one.
	GPUSample *GPU `json:"gpu_sample"`
	// Straggler is the straggler verdict that names this rank; null when
	// none does.
	Straggler *Straggler `json:"straggler"`
}

// Straggler is how much slower than the others a rank named a straggler
// is (the coordinator's straggler verdict, package internal/coordinator/rhythm).
type Straggler struct {
	Comm string `json:"comm"`
	// SlowerPercent is its extra compute per collective over the other
	// ranks' median, in percent.
	SlowerPercent float64 `json:"slower_percent"`
	// ArrivesLastPercent is at how many of the recent collectives it
	// arrived last, in percent; null when the workers do not say.
	ArrivesLastPercent *float64 `json:"arrives_last_percent"`
}

// Collective is a rank's last collective.
type Collective struct {
	Comm  string `json:"comm"`
	Op    string `json:"op"`
	Seq   int64  `json:"seq"`
	Dtype string `json:"dtype"`
	Count int64  `json:"count"`
	// State is "waiting" (entered, not completed), "failed" or "completed".
	State string `json:"state"`
	// WaitingSeconds is how long it has waited, for state "waiting".
	WaitingSeconds float64 `json:"waiting_seconds"`
}

// GPU is a rank's GPU sample. Values NVML could not give are -1.
type GPU struct {
	Index            int     `json:"index"`
	UUID             string  `json:"uuid"`
	Name             string  `json:"name"`
	UtilPercent      int     `json:"util_percent"`
	MemoryUsedBytes  uint64  `json:"memory_used_bytes"`
	MemoryTotalBytes uint64  `json:"memory_total_bytes"`
	PowerWatts       float64 `json:"power_watts"`
	PowerLimitWatts  float64 `json:"power_limit_watts"`
	TemperatureC     int     `json:"temperature_c"`
	SlowdownTempC    int     `json:"slowdown_temperature_c"`
	SMClockMHz       int     `json:"sm_clock_mhz"`
	// ThrottleReasons are NVML's reasons the clocks are held down, as
	// snake_case words ("sw_power_cap", "hw_thermal_slowdown", ...).
	ThrottleReasons    []string `json:"throttle_reasons"`
	ThrottledThermally bool     `json:"throttled_thermal"`
	ThrottledPower     bool     `json:"throttled_power"`
	// XIDErrors counts the GPU's XID errors since its agent started.
	XIDErrors         uint64  `json:"xid_errors"`
	LastXID           uint64  `json:"last_xid"`
	SampledAgoSeconds float64 `json:"sampled_ago_seconds"`
}

// Build makes the snapshot of st at now, ranks sorted slowest first.
func Build(st *gotrainv1.JobStatus, now time.Time) Snapshot {
	s := Snapshot{
		RunID: st.GetRunId(), State: st.GetState(), Generation: st.GetGeneration(),
		WorldSize: int(st.GetWorldSize()), RestartCount: int(st.GetRestartCount()),
		Time: now.UTC().Format(time.RFC3339Nano), Ranks: []Rank{}, Findings: []Finding{},
	}
	for _, f := range symptoms.Find(symptoms.FromStatus(st)) {
		s.Findings = append(s.Findings, Finding{Kind: f.Kind, Rank: f.Rank, Text: f.Text})
	}
	strag := stragglers(st.GetVerdicts())
	for _, r := range st.GetRanks() {
		row := buildRank(r, now)
		row.Straggler = strag[row.Rank]
		s.Ranks = append(s.Ranks, row)
	}
	slices.SortStableFunc(s.Ranks, slowestFirst)
	return s
}

func buildRank(r *gotrainv1.RankStatus, now time.Time) Rank {
	p := r.GetProgress()
	out := Rank{
		Rank: int(r.GetRank()), Host: r.GetHostname(), GPU: int(r.GetGpu()), State: r.GetState(),
		PID: int(p.GetPid()), ProcessState: p.GetProcessState(), Attached: p.GetAttached(), StepSource: p.GetStepSource(),
		Step: p.GetStep(), CPUPercent: cpuPercent(p), StepsPerSecond: p.GetStepsPerSecond(), SamplesPerSecond: p.GetSamplesPerSecond(),
	}
	if n := p.GetProgressUnixNanos(); n != 0 && (p.GetAttached() || p.GetStepSource() != "") {
		d := max(0, now.Sub(time.Unix(0, n)).Seconds())
		out.SinceProgressSeconds = &d
	}
	out.LastCollective = lastCollective(p.GetComms(), now)
	if g := p.GetGpu(); g != nil {
		th := gpuinfo.Throttle(g.GetThrottleReasons())
		names := th.Names()
		if names == nil {
			names = []string{}
		}
		out.GPUSample = &GPU{
			Index: int(g.GetIndex()), UUID: g.GetUuid(), Name: g.GetName(), UtilPercent: int(g.GetUtilPercent()),
			MemoryUsedBytes: g.GetMemoryUsedBytes(), MemoryTotalBytes: g.GetMemoryTotalBytes(),
			PowerWatts: g.GetPowerWatts(), PowerLimitWatts: g.GetPowerLimitWatts(),
			TemperatureC: int(g.GetTemperatureC()), SlowdownTempC: int(g.GetSlowdownTemperatureC()), SMClockMHz: int(g.GetSmClockMhz()),
			ThrottleReasons: names, XIDErrors: g.GetXidErrors(), LastXID: g.GetLastXid(),
			SampledAgoSeconds:  max(0, now.Sub(time.Unix(0, g.GetUnixNanos())).Seconds()),
			ThrottledThermally: th&gpuinfo.ThrottleThermal != 0, ThrottledPower: th&gpuinfo.ThrottlePower != 0,
		}
	}
	return out
}

// stragglers returns, by rank, the straggler verdicts' figures (the most
// slowed communicator's when several name one rank).
func stragglers(vs []*gotrainv1.HangVerdict) map[int]*Straggler {
	out := map[int]*Straggler{}
	for _, v := range vs {
		f := v.GetStraggler()
		if v.GetKind() != "straggler" || f == nil || len(v.GetCulprits()) == 0 {
			continue
		}
		r := int(v.GetCulprits()[0].GetRank())
		s := &Straggler{Comm: v.GetComm(), SlowerPercent: 100 * f.GetSlower()}
		if f.GetCommon() > 0 {
			p := 100 * f.GetLastShare()
			s.ArrivesLastPercent = &p
		}
		if old := out[r]; old == nil || s.SlowerPercent > old.SlowerPercent {
			out[r] = s
		}
	}
	return out
}

// lastCollective is the oldest collective a rank waits in, else the one it
// completed last.
func lastCollective(comms []*gotrainv1.CommProgress, now time.Time) *Collective {
	var waiting, done *gotrainv1.CommProgress
	for _, c := range comms {
		if pc := c.GetPending(); pc != nil {
			if waiting == nil || pc.GetEnqueuedUnixNanos() < waiting.GetPending().GetEnqueuedUnixNanos() {
				waiting = c
			}
		} else if c.GetCompletedSeq() > 0 && (done == nil || c.GetCompletedUnixNanos() > done.GetCompletedUnixNanos()) {
			done = c
		}
	}
	switch {
	case waiting != nil:
		pc := waiting.GetPending()
		out := &Collective{Comm: waiting.GetComm(), Op: pc.GetOp(), Seq: pc.GetSeq(), Dtype: pc.GetDtype(), Count: pc.GetCount(), State: "waiting"}
		if pc.GetState() == "failed" {
			out.State = "failed"
		} else if n := pc.GetEnqueuedUnixNanos(); n != 0 {
			out.WaitingSeconds = max(0, now.Sub(time.Unix(0, n)).Seconds())
		}
		return out
	case done != nil:
		return &Collective{Comm: done.GetComm(), Op: done.GetLastOp(), Seq: done.GetCompletedSeq(), Dtype: done.GetLastDtype(), Count: done.GetLastCount(), State: "completed"}
	}
	return nil
}

// slowestFirst orders ranks: the longest since progress (whole seconds)
// first, then the lowest step rate, then by rank; unknown progress last.
func slowestFirst(a, b Rank) int {
	since := func(r Rank) float64 {
		if r.SinceProgressSeconds == nil {
			return -1
		}
		return math.Floor(*r.SinceProgressSeconds)
	}
	slowed := func(r Rank) float64 {
		if r.Straggler == nil {
			return 0
		}
		return r.Straggler.SlowerPercent
	}
	return cmp.Or(
		cmp.Compare(since(b), since(a)),
		cmp.Compare(slowed(b), slowed(a)),
		cmp.Compare(a.StepsPerSecond, b.StepsPerSecond),
		cmp.Compare(a.Rank, b.Rank),
	)
}

// cpuPercent is p's CPU use, nil when unknown.
func cpuPercent(p *gotrainv1.RankProgress) *float64 {
	if p == nil || p.CpuPercent == nil {
		return nil
	}
	v := p.GetCpuPercent()
	return &v
}

// WriteTable writes the snapshot for people: a header line, the findings,
// then a table.
func (s Snapshot) WriteTable(w io.Writer) error {
	fmt.Fprintf(w, "job %s: %s, generation %d, %d ranks, %d restarts   %s\n", s.RunID, s.State, s.Generation, s.WorldSize, s.RestartCount, s.Time)
	for _, f := range s.Findings {
		fmt.Fprintf(w, "note: %s\n", f.Text)
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "RANK\tHOST\tGPU\tUTIL\tMEMORY\tPOWER\tTEMP\tSM MHz\tTHROTTLE\tCPU\tSTEP\tSTEP/S\tSINCE PROGRESS\tSTRAGGLER\tLAST COLLECTIVE\tSTATE")
	for _, r := range s.Ranks {
		gpu, util, mem, power, temp, clock, throttle := "-", "-", "-", "-", "-", "-", "-"
		if r.GPU >= 0 {
			gpu = fmt.Sprint(r.GPU)
		}
		if g := r.GPUSample; g != nil {
			util = pct(g.UtilPercent)
			mem = fmt.Sprintf("%s/%s", gib(g.MemoryUsedBytes), gib(g.MemoryTotalBytes))
			power = fmt.Sprintf("%s/%s", watts(g.PowerWatts), watts(g.PowerLimitWatts))
			if g.TemperatureC >= 0 {
				temp = fmt.Sprintf("%d°C", g.TemperatureC)
			}
			if g.SMClockMHz >= 0 {
				clock = fmt.Sprint(g.SMClockMHz)
			}
			throttle = throttleWords(g)
		}
		step, rate, since, cpu := "-", "-", "-", "-"
		if r.CPUPercent != nil {
			cpu = fmt.Sprintf("%.0f%%", *r.CPUPercent)
		}
		if r.Attached || r.StepSource != "" {
			step = fmt.Sprint(r.Step)
			rate = fmt.Sprintf("%.2f", r.StepsPerSecond)
		}
		if r.SinceProgressSeconds != nil {
			since = (time.Duration(*r.SinceProgressSeconds * float64(time.Second))).Round(100 * time.Millisecond).String()
		}
		state := r.State
		if r.ProcessState != "" {
			state += " (" + r.ProcessState + ")"
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.Rank, r.Host, gpu, util, mem, power, temp, clock, throttle,
			cpu, step, rate, since, stragglerWords(r.Straggler), describe(r.LastCollective), state)
	}
	return tw.Flush()
}

// stragglerWords is "+85% slower, last 90%" or "-".
func stragglerWords(s *Straggler) string {
	if s == nil {
		return "-"
	}
	w := fmt.Sprintf("+%.0f%% slower", s.SlowerPercent)
	if s.ArrivesLastPercent != nil {
		w += fmt.Sprintf(", last %.0f%%", *s.ArrivesLastPercent)
	}
	return w
}

func describe(c *Collective) string {
	if c == nil {
		return "-"
	}
	s := fmt.Sprintf("%s #%d %s", c.Op, c.Seq, c.Comm)
	switch c.State {
	case "waiting":
		s += fmt.Sprintf(" waiting %s", (time.Duration(c.WaitingSeconds * float64(time.Second))).Round(100*time.Millisecond))
	case "failed":
		s += " failed"
	default:
		s += " done"
	}
	return s
}

func throttleWords(g *GPU) string {
	var w []string
	if g.ThrottledThermally {
		w = append(w, "thermal")
	}
	if g.ThrottledPower {
		w = append(w, "power")
	}
	if g.XIDErrors > 0 {
		w = append(w, fmt.Sprintf("XID %d (x%d)", g.LastXID, g.XIDErrors))
	}
	if len(w) == 0 {
		return "-"
	}
	return strings.Join(w, ",")
}

func pct(v int) string {
	if v < 0 {
		return "N/A"
	}
	return fmt.Sprintf("%d%%", v)
}

func gib(b uint64) string { return fmt.Sprintf("%.1fG", float64(b)/(1<<30)) }

func watts(w float64) string {
	if w < 0 {
		return "N/A"
	}
	return fmt.Sprintf("%.0fW", w)
}
