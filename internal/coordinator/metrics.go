package coordinator

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	gotrainv1 "github.com/gotrain/gotrain/proto/gotrain/v1"
)

// Prometheus metrics: a collector that reads the job's status at scrape
// time, on a registry of its own (never the global one), served at /metrics
// on a listener of its own. Job gauges carry the label run_id; per-rank
// gauges add rank, host and gpu (the GPU's NVML index on its node, "" for
// ranks without a GPU).

// jobStates are the values of gotrain_job_state's state label.
var jobStates = []string{"waiting", "running", "restarting", "succeeded", "failed"}

var (
	rankLabels = []string{"rank", "host", "gpu"}

	descGeneration = prometheus.NewDesc("gotrain_job_generation", "The job's current generation (0 for the first).", nil, nil)
	descRestarts   = prometheus.NewDesc("gotrain_job_restarts", "How many times the job restarted after a failure.", nil, nil)
	descWorldSize  = prometheus.NewDesc("gotrain_job_world_size", "Ranks in the current generation.", nil, nil)
	descNodes      = prometheus.NewDesc("gotrain_job_nodes", "Nodes (agents) in the job.", nil, nil)
	descState      = prometheus.NewDesc("gotrain_job_state", "1 for the job's state, 0 for the others.", []string{"state"}, nil)
	descVerdicts   = prometheus.NewDesc("gotrain_job_hang_verdicts", "Hang verdicts in force for the current generation.", nil, nil)
	// straggler: the hang timeout in force and the straggler's slowdown.
	descHangTimeout = prometheus.NewDesc("gotrain_job_hang_timeout_seconds", "The hang timeout in force: the given --hang-timeout, or the adaptive one (adaptive=\"true\", the longest over the communicators).", []string{"adaptive"}, nil)
	descStraggler   = prometheus.NewDesc("gotrain_rank_straggler_slower_ratio", "How much more compute per collective the rank spends than the other ranks' median when a straggler verdict names it (1 = 100 % slower), else 0.", rankLabels, nil)

	descRankRunning  = prometheus.NewDesc("gotrain_rank_running", "1 while the rank's process runs, else 0.", rankLabels, nil)
	descRankStep     = prometheus.NewDesc("gotrain_rank_step", "The training step the rank reported last.", rankLabels, nil)
	descRankSteps    = prometheus.NewDesc("gotrain_rank_steps_per_second", "The rank's step rate over the last seconds.", rankLabels, nil)
	descRankSamples  = prometheus.NewDesc("gotrain_rank_samples_per_second", "The rank's throughput as it reported it.", rankLabels, nil)
	descRankSince    = prometheus.NewDesc("gotrain_rank_seconds_since_progress", "Seconds since the rank's step or a collective of it last moved.", rankLabels, nil)
	descRankDone     = prometheus.NewDesc("gotrain_rank_collectives_completed", "Collectives the rank completed in this generation, over all its communicators.", rankLabels, nil)
	descRankReported = prometheus.NewDesc("gotrain_rank_last_report_timestamp_seconds", "When the rank's worker last reported (its clock).", rankLabels, nil)

	descGPUUtil      = prometheus.NewDesc("gotrain_gpu_utilization_ratio", "GPU utilisation over NVML's last sample period, 0 to 1.", rankLabels, nil)
	descGPUMemUsed   = prometheus.NewDesc("gotrain_gpu_memory_used_bytes", "GPU memory used by processes.", rankLabels, nil)
	descGPUMemTotal  = prometheus.NewDesc("gotrain_gpu_memory_total_bytes", "GPU memory in total.", rankLabels, nil)
	descGPUPower     = prometheus.NewDesc("gotrain_gpu_power_watts", "GPU power draw.", rankLabels, nil)
	descGPUPowerCap  = prometheus.NewDesc("gotrain_gpu_power_limit_watts", "GPU power limit enforced.", rankLabels, nil)
	descGPUTemp      = prometheus.NewDesc("gotrain_gpu_temperature_celsius", "GPU temperature.", rankLabels, nil)
	descGPUSlowdown  = prometheus.NewDesc("gotrain_gpu_slowdown_temperature_celsius", "Temperature at which the GPU slows itself down.", rankLabels, nil)
	descGPUClock     = prometheus.NewDesc("gotrain_gpu_sm_clock_hertz", "GPU SM clock.", rankLabels, nil)
	descGPUThrottle  = prometheus.NewDesc("gotrain_gpu_throttle_reasons", "NVML's clock event (throttle) reasons bit set.", rankLabels, nil)
	descGPUThrottled = prometheus.NewDesc("gotrain_gpu_throttled", "1 when the GPU's clocks are held down by heat (kind=thermal) or its power limit (kind=power).",
		[]string{"rank", "host", "gpu", "kind"}, nil)
	descGPUXID    = prometheus.NewDesc("gotrain_gpu_xid_errors_total", "XID errors the driver reported for the GPU since its agent started.", rankLabels, nil)
	descGPUSample = prometheus.NewDesc("gotrain_gpu_sample_timestamp_seconds", "When the agent sampled the GPU (its clock).", rankLabels, nil)
)

// NVML throttle reason bits (gpuinfo.Throttle), repeated here so that the
// coordinator does not link NVML.
const (
	throttleThermal = 0x20 | 0x40 // sw and hw thermal slowdown
	throttlePower   = 0x4 | 0x80  // sw power cap, hw power brake
)

// collector turns the job's status into metrics at scrape time.
type collector struct{ s *Server }

var _ prometheus.Collector = collector{}

func (c collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descGeneration, descRestarts, descWorldSize, descNodes, descState, descVerdicts, descHangTimeout, descStraggler,
		descRankRunning, descRankStep, descRankSteps, descRankSamples, descRankSince, descRankDone, descRankReported,
		descGPUUtil, descGPUMemUsed, descGPUMemTotal, descGPUPower, descGPUPowerCap, descGPUTemp, descGPUSlowdown,
		descGPUClock, descGPUThrottle, descGPUThrottled, descGPUXID, descGPUSample} {
		ch <- d
	}
}

func (c collector) Collect(ch chan<- prometheus.Metric) {
	c.s.mu.Lock()
	now := c.s.now()
	st := statusToProto(c.s.st.Machine().Status())
	timeout, adaptive := c.s.st.Machine().HangTimeout()
	c.s.mu.Unlock()
	collectStatus(ch, st, now)
	ch <- prometheus.MustNewConstMetric(descHangTimeout, prometheus.GaugeValue, timeout.Seconds(), strconv.FormatBool(adaptive))
}

// collectStatus writes the metrics of st as seen at now.
func collectStatus(ch chan<- prometheus.Metric, st *gotrainv1.JobStatus, now time.Time) {
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	gauge(descGeneration, float64(st.GetGeneration()))
	gauge(descRestarts, float64(st.GetRestartCount()))
	gauge(descWorldSize, float64(st.GetWorldSize()))
	gauge(descNodes, float64(len(st.GetNodes())))
	gauge(descVerdicts, float64(len(st.GetVerdicts())))
	for _, s := range jobStates {
		gauge(descState, b2f(st.GetState() == s), s)
	}
	slower := map[int32]float64{} // straggler verdicts by rank
	for _, v := range st.GetVerdicts() {
		if f := v.GetStraggler(); f != nil && len(v.GetCulprits()) > 0 {
			r := v.GetCulprits()[0].GetRank()
			slower[r] = max(slower[r], f.GetSlower())
		}
	}
	for _, r := range st.GetRanks() {
		gpu := ""
		if r.GetGpu() >= 0 {
			gpu = strconv.Itoa(int(r.GetGpu()))
		}
		l := []string{strconv.Itoa(int(r.GetRank())), r.GetHostname(), gpu}
		gauge(descRankRunning, b2f(r.GetState() == "running"), l...)
		p := r.GetProgress()
		if p == nil {
			continue
		}
		if p.GetAttached() {
			var done int64
			for _, c := range p.GetComms() {
				done += c.GetCompletedSeq()
			}
			gauge(descRankStep, float64(p.GetStep()), l...)
			gauge(descRankSteps, p.GetStepsPerSecond(), l...)
			gauge(descRankSamples, p.GetSamplesPerSecond(), l...)
			gauge(descRankDone, float64(done), l...)
			gauge(descStraggler, slower[r.GetRank()], l...)
			if n := p.GetUnixNanos(); n != 0 {
				gauge(descRankReported, float64(n)/1e9, l...)
			}
			if n := p.GetProgressUnixNanos(); n != 0 {
				gauge(descRankSince, max(0, now.Sub(time.Unix(0, n)).Seconds()), l...)
			}
		}
		g := p.GetGpu()
		if g == nil {
			continue
		}
		if v := g.GetUtilPercent(); v >= 0 {
			gauge(descGPUUtil, float64(v)/100, l...)
		}
		gauge(descGPUMemUsed, float64(g.GetMemoryUsedBytes()), l...)
		gauge(descGPUMemTotal, float64(g.GetMemoryTotalBytes()), l...)
		if v := g.GetPowerWatts(); v >= 0 {
			gauge(descGPUPower, v, l...)
		}
		if v := g.GetPowerLimitWatts(); v >= 0 {
			gauge(descGPUPowerCap, v, l...)
		}
		if v := g.GetTemperatureC(); v >= 0 {
			gauge(descGPUTemp, float64(v), l...)
		}
		if v := g.GetSlowdownTemperatureC(); v >= 0 {
			gauge(descGPUSlowdown, float64(v), l...)
		}
		if v := g.GetSmClockMhz(); v >= 0 {
			gauge(descGPUClock, float64(v)*1e6, l...)
		}
		gauge(descGPUThrottle, float64(g.GetThrottleReasons()), l...)
		gauge(descGPUThrottled, b2f(g.GetThrottleReasons()&throttleThermal != 0), l[0], l[1], l[2], "thermal")
		gauge(descGPUThrottled, b2f(g.GetThrottleReasons()&throttlePower != 0), l[0], l[1], l[2], "power")
		ch <- prometheus.MustNewConstMetric(descGPUXID, prometheus.CounterValue, float64(g.GetXidErrors()), l...)
		gauge(descGPUSample, float64(g.GetUnixNanos())/1e9, l...)
	}
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// MetricsHandler serves the job's metrics in Prometheus' text format.
func (s *Server) MetricsHandler() http.Handler {
	reg := prometheus.NewRegistry()
	prometheus.WrapRegistererWith(prometheus.Labels{"run_id": s.cfg.Job.RunID}, reg).MustRegister(collector{s}, s.recoveries)
	return promhttp.HandlerFor(reg, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError})
}

// ServeMetrics serves /metrics on lis until ctx is done.
func (s *Server) ServeMetrics(ctx context.Context, lis net.Listener) error {
	mux := http.NewServeMux()
	mux.Handle("/metrics", s.MetricsHandler())
	// Bounds on one scrape (the caller bounds the connections,
	// internal/coordinator/host/bounds.go): its header, its whole request and its
	// answer in seconds, a connection between scrapes (Prometheus scrapes
	// every 15–60 s) a minute, headers 16 KiB.
	hs := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 15 * time.Second,
		WriteTimeout: 30 * time.Second, IdleTimeout: 90 * time.Second, MaxHeaderBytes: 16 << 10}
	served := make(chan error, 1)
	go func() { served <- hs.Serve(lis) }()
	select {
	case err := <-served:
		return fmt.Errorf("coordinator: metrics on %s: %w", lis.Addr(), err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), stopGrace)
	defer cancel()
	if hs.Shutdown(sctx) != nil {
		_ = hs.Close() // connections still open (a scrape, or one never sent): closed, their goroutines end
	}
	if err := <-served; !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("coordinator: metrics on %s: %w", lis.Addr(), err)
	}
	return nil
}

// recoveryBuckets span a restart's phases: a standby's hand-over (ms) to
// a large model's restore or a cold start's imports (a minute).
var recoveryBuckets = []float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120}

// maxRecoveriesPerReport bounds what one progress report can add: an agent
// times one restart per generation.
const maxRecoveriesPerReport = 8

func newRecoveryHistograms() *prometheus.HistogramVec {
	return prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "gotrain_recovery_phase_seconds",
		Help:    "How long each phase of a restart took on a node (internal/launcher/recovery): detected, stopped, rendezvous, started (start=standby or cold), imports, init_process_group, setup, restored, first_step, and total.",
		Buckets: recoveryBuckets,
	}, []string{"phase", "start"})
}

// recoveryPhaseLabel is a phase's metric label: the known names, spaces
// as underscores; anything else an agent sent is not observed.
func recoveryPhaseLabel(name string) (string, bool) {
	switch name {
	case "detected", "stopped", "rendezvous", "started", "imports", "init_process_group", "setup", "restored":
		return name, true
	case "first step":
		return "first_step", true
	}
	return "", false
}

// observeRecoveries adds an agent's timed restarts to the histograms.
func (s *Server) observeRecoveries(rs []*gotrainv1.RecoveryTiming) {
	for i, r := range rs {
		if i == maxRecoveriesPerReport {
			break
		}
		start := ""
		for _, p := range r.GetPhases() {
			if p.GetName() == "started" && (p.GetDetail() == "standby" || p.GetDetail() == "cold") {
				start = p.GetDetail()
			}
		}
		ok := func(v float64) bool { return v >= 0 && v < 1e6 } // NaN fails both
		for _, p := range r.GetPhases() {
			if name, known := recoveryPhaseLabel(p.GetName()); known && ok(p.GetSeconds()) {
				s.recoveries.WithLabelValues(name, start).Observe(p.GetSeconds())
			}
		}
		if ok(r.GetSeconds()) {
			s.recoveries.WithLabelValues("total", start).Observe(r.GetSeconds())
		}
	}
}
