package coordinator

import (
	"github.com/gotrain/gotrain/internal/coordinator/job"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	gotrainv1 "github.com/gotrain/gotrain/proto/gotrain/v1"
)

// scrape reads h's metrics and parses them with Prometheus' text parser.
func scrape(t *testing.T, h http.Handler) map[string]*dto.MetricFamily {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	if rec.Code != http.StatusOK {
		t.Fatalf("GET /metrics: %d %s", rec.Code, rec.Body)
	}
	p := expfmt.NewTextParser(model.LegacyValidation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(rec.Body.String()))
	if err != nil {
		t.Fatalf("parse /metrics: %v\n%s", err, rec.Body)
	}
	return fams
}

// metricValue returns the value of the metric of family name whose labels
// include want; ok is false when there is none.
func metricValue(fams map[string]*dto.MetricFamily, name string, want map[string]string) (float64, bool) {
	f := fams[name]
	if f == nil {
		return 0, false
	}
next:
	for _, m := range f.GetMetric() {
		have := map[string]string{}
		for _, l := range m.GetLabel() {
			have[l.GetName()] = l.GetValue()
		}
		for k, v := range want {
			if have[k] != v {
				continue next
			}
		}
		switch {
		case m.GetGauge() != nil:
			return m.GetGauge().GetValue(), true
		case m.GetCounter() != nil:
			return m.GetCounter().GetValue(), true
		}
	}
	return 0, false
}

func TestMetrics(t *testing.T) {
	srv, addr := startServer(t, Config{Job: job.Config{Nodes: 1}}, testHooks{})
	c := newClient(t, addr)
	a := join(t, c, "host-a", "10.0.0.1", 2, 29500)
	stream := a.watch(rpcCtx(t))
	ev, err := stream.Recv()
	if err != nil || ev.GetStarted() == nil {
		t.Fatalf("first event %v, %v; want started", ev, err)
	}
	sampled := time.Unix(1_800_000_000, 0)
	now := srv.now()
	progressed := now.Add(-3 * time.Second)
	_, err = c.ReportProgress(rpcCtx(t), &gotrainv1.ReportProgressRequest{NodeId: a.id, Ranks: []*gotrainv1.RankProgress{
		{Rank: 0, Generation: 0, Step: 42, SamplesPerSecond: 512, StepsPerSecond: 4, Attached: true, UnixNanos: now.UnixNano(),
			ProgressUnixNanos: progressed.UnixNano(),
			Comms:             []*gotrainv1.CommProgress{{Comm: "dp", EnteredSeq: 11, CompletedSeq: 10}, {Comm: "pp", CompletedSeq: 5}},
			Gpu: &gotrainv1.GPUSample{Index: 0, Uuid: "GPU-host-a-0", Name: "NVIDIA H200", UnixNanos: sampled.UnixNano(),
				UtilPercent: 97, MemoryUsedBytes: 80 << 30, MemoryTotalBytes: 141 << 30, PowerWatts: 650, PowerLimitWatts: 700,
				TemperatureC: 71, SlowdownTemperatureC: 87, SmClockMhz: 1980, ThrottleReasons: 0x4, XidErrors: 2, LastXid: 79}},
		{Rank: 1, Generation: 0}, // a program that does not attach, on a node without NVML
	}})
	if err != nil {
		t.Fatal(err)
	}

	fams := scrape(t, srv.MetricsHandler())
	r0 := map[string]string{"rank": "0", "host": "host-a", "gpu": "0", "run_id": "run-test"}
	r1 := map[string]string{"rank": "1", "host": "host-a", "gpu": "1"}
	for _, tc := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"gotrain_job_generation", nil, 0},
		{"gotrain_job_restarts", nil, 0},
		{"gotrain_job_world_size", nil, 2},
		{"gotrain_job_nodes", nil, 1},
		{"gotrain_job_state", map[string]string{"state": "running"}, 1},
		{"gotrain_job_state", map[string]string{"state": "failed"}, 0},
		{"gotrain_rank_running", r0, 1},
		{"gotrain_rank_running", r1, 1},
		{"gotrain_rank_step", r0, 42},
		{"gotrain_rank_steps_per_second", r0, 4},
		{"gotrain_rank_samples_per_second", r0, 512},
		{"gotrain_rank_collectives_completed", r0, 15},
		{"gotrain_rank_straggler_slower_ratio", r0, 0},
		{"gotrain_job_hang_timeout_seconds", map[string]string{"adaptive": "true"}, 120},
		{"gotrain_gpu_utilization_ratio", r0, 0.97},
		{"gotrain_gpu_memory_used_bytes", r0, 80 << 30},
		{"gotrain_gpu_memory_total_bytes", r0, 141 << 30},
		{"gotrain_gpu_power_watts", r0, 650},
		{"gotrain_gpu_power_limit_watts", r0, 700},
		{"gotrain_gpu_temperature_celsius", r0, 71},
		{"gotrain_gpu_sm_clock_hertz", r0, 1980e6},
		{"gotrain_gpu_throttle_reasons", r0, 4},
		{"gotrain_gpu_throttled", map[string]string{"rank": "0", "kind": "power"}, 1},
		{"gotrain_gpu_throttled", map[string]string{"rank": "0", "kind": "thermal"}, 0},
		{"gotrain_gpu_xid_errors_total", r0, 2},
		{"gotrain_gpu_sample_timestamp_seconds", r0, float64(sampled.Unix())},
	} {
		got, ok := metricValue(fams, tc.name, tc.labels)
		if !ok || got != tc.want {
			t.Errorf("%s%v = %v (found %v), want %v", tc.name, tc.labels, got, ok, tc.want)
		}
	}
	if got, ok := metricValue(fams, "gotrain_rank_seconds_since_progress", r0); !ok || got < 3 || got > 3+rpcTimeout.Seconds() {
		t.Errorf("seconds since progress = %v (found %v), want about 3", got, ok)
	}
	// Rank 1 reports nothing it does not know.
	for _, name := range []string{"gotrain_rank_step", "gotrain_rank_seconds_since_progress", "gotrain_gpu_temperature_celsius"} {
		if _, ok := metricValue(fams, name, r1); ok {
			t.Errorf("%s has a value for rank 1, which neither attached nor has a GPU sample", name)
		}
	}

	// GetJobStatus carries the same telemetry.
	st, err := c.GetJobStatus(rpcCtx(t), &gotrainv1.GetJobStatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	p := st.GetRanks()[0].GetProgress()
	if p.GetStepsPerSecond() != 4 || p.GetProgressUnixNanos() != progressed.UnixNano() || p.GetGpu().GetTemperatureC() != 71 ||
		p.GetGpu().GetLastXid() != 79 || p.GetGpu().GetName() != "NVIDIA H200" {
		t.Errorf("rank 0's progress in GetJobStatus: %v", p)
	}
	if st.GetRanks()[1].GetProgress().GetGpu() != nil {
		t.Errorf("rank 1 got a GPU sample: %v", st.GetRanks()[1].GetProgress())
	}
}

// histogram returns the sample count and sum of the histogram of family
// name whose labels include want.
func histogram(fams map[string]*dto.MetricFamily, name string, want map[string]string) (count uint64, sum float64, ok bool) {
	f := fams[name]
	if f == nil {
		return 0, 0, false
	}
next:
	for _, m := range f.GetMetric() {
		have := map[string]string{}
		for _, l := range m.GetLabel() {
			have[l.GetName()] = l.GetValue()
		}
		for k, v := range want {
			if have[k] != v {
				continue next
			}
		}
		if h := m.GetHistogram(); h != nil {
			return h.GetSampleCount(), h.GetSampleSum(), true
		}
	}
	return 0, 0, false
}

// The agents' timed restarts become one histogram per phase, labelled by
// how the rank started; a phase no agent should send is not observed.
func TestRecoveryHistograms(t *testing.T) {
	srv, addr := startServer(t, Config{Job: job.Config{Nodes: 1}}, testHooks{})
	c := newClient(t, addr)
	a := join(t, c, "host-a", "10.0.0.1", 1, 29500)
	stream := a.watch(rpcCtx(t))
	if ev, err := stream.Recv(); err != nil || ev.GetStarted() == nil {
		t.Fatalf("first event %v, %v; want started", ev, err)
	}
	timing := func(total float64, start string) *gotrainv1.RecoveryTiming {
		return &gotrainv1.RecoveryTiming{Generation: 1, Seconds: total, Phases: []*gotrainv1.RecoveryPhase{
			{Name: "detected", Seconds: 0.01}, {Name: "started", Seconds: 0.05, Detail: start},
			{Name: "first step", Seconds: 0.5}, {Name: "made up", Seconds: 3}}}
	}
	for _, r := range []*gotrainv1.RecoveryTiming{timing(1.8, "standby"), timing(4, "cold"), timing(2.2, "standby")} {
		if _, err := c.ReportProgress(rpcCtx(t), &gotrainv1.ReportProgressRequest{NodeId: a.id, Recoveries: []*gotrainv1.RecoveryTiming{r}}); err != nil {
			t.Fatal(err)
		}
	}
	fams := scrape(t, srv.MetricsHandler())
	for _, tc := range []struct {
		phase, start string
		count        uint64
		sum          float64
	}{
		{"total", "standby", 2, 4.0},
		{"total", "cold", 1, 4},
		{"first_step", "standby", 2, 1.0},
		{"started", "cold", 1, 0.05},
	} {
		n, sum, ok := histogram(fams, "gotrain_recovery_phase_seconds", map[string]string{"phase": tc.phase, "start": tc.start, "run_id": "run-test"})
		if !ok || n != tc.count || sum < tc.sum-1e-9 || sum > tc.sum+1e-9 {
			t.Errorf("gotrain_recovery_phase_seconds{phase=%q,start=%q}: count %d sum %v (found %v), want %d and %v", tc.phase, tc.start, n, sum, ok, tc.count, tc.sum)
		}
	}
	if _, _, ok := histogram(fams, "gotrain_recovery_phase_seconds", map[string]string{"phase": "made up"}); ok {
		t.Error("a phase no agent sends was observed")
	}
}
