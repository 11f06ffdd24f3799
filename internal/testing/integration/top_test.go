package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/gotrain/gotrain/internal/testing/testkit"
)

// A CPU job of two ranks (testprog's training loop, which reports its steps)
// shows up in `gotrain top --once --json` and in the coordinator's /metrics.

// topJSON is the part of `gotrain top --json` the test reads, with the
// field names scripts rely on.
type topJSON struct {
	RunID     string `json:"run_id"`
	State     string `json:"state"`
	WorldSize int    `json:"world_size"`
	Ranks     []struct {
		Rank                 int      `json:"rank"`
		Host                 string   `json:"host"`
		GPU                  int      `json:"gpu"`
		State                string   `json:"state"`
		PID                  int      `json:"pid"`
		Attached             bool     `json:"attached"`
		StepSource           string   `json:"step_source"`
		CPUPercent           *float64 `json:"cpu_percent"`
		Step                 int64    `json:"step"`
		StepsPerSecond       float64  `json:"steps_per_second"`
		SinceProgressSeconds *float64 `json:"since_progress_seconds"`
		LastCollective       *struct {
			Comm  string `json:"comm"`
			Op    string `json:"op"`
			Seq   int64  `json:"seq"`
			State string `json:"state"`
		} `json:"last_collective"`
		GPUSample *json.RawMessage `json:"gpu_sample"`
	} `json:"ranks"`
}

// gotrainTop runs `gotrain top ARGS` against r's job (found through its run
// file) and returns its stdout.
func gotrainTop(t *testing.T, r *running, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin.gotrain, append([]string{"top"}, args...)...)
	cmd.Env = r.env
	out, err := cmd.Output()
	if err != nil {
		var stderr []byte
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = ee.Stderr
		}
		t.Fatalf("gotrain top %v: %v\nstdout:\n%s\nstderr:\n%s", args, err, out, stderr)
	}
	return string(out)
}

// healthy reports whether every rank of the snapshot made visible progress.
func healthy(s topJSON, ranks int) bool {
	if s.State != "running" || len(s.Ranks) != ranks {
		return false
	}
	for _, r := range s.Ranks {
		if !r.Attached || r.Step < 3 || r.StepsPerSecond <= 0 || r.SinceProgressSeconds == nil || r.LastCollective == nil {
			return false
		}
	}
	return true
}

var metricsLine = regexp.MustCompile(`^gotrain: metrics at http://(\S+)/metrics$`)

func TestTopAndMetrics(t *testing.T) {
	t.Parallel()
	const ranks = 2
	runtimeDir := t.TempDir()
	r := startLaunch(t, runtimeDir, "launch", "--nproc-per-node", strconv.Itoa(ranks), "--backend", "cpu", "--max-restarts", "0",
		"--metrics-addr", "127.0.0.1:0", "--grace-period", "1s", "--",
		bin.testprog, "hang", "--fault", "none", "--steps", "100000", "--step-time", "50ms")
	addr := metricsLine.FindStringSubmatch(r.waitFor(t, metricsLine, 60*time.Second).text)[1]

	// The run file records the metrics address; it is written once the
	// agent joined its coordinator, after the metrics line.
	var rf struct {
		Metrics string `json:"metrics"`
	}
	var files []string
	testkit.WaitFor(t, 60*time.Second, "the run file", func() bool {
		files, _ = filepath.Glob(filepath.Join(runtimeDir, "gotrain", "*.json"))
		return len(files) > 0
	})
	if len(files) > 1 {
		t.Fatalf("run files %v, want one", files)
	}
	b, err := os.ReadFile(files[0])
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &rf); err != nil || rf.Metrics != addr {
		t.Errorf("run file %s: metrics %q (%v), want %q", b, rf.Metrics, err, addr)
	}

	// gotrain top --once --json: poll until every rank reported steps.
	var snap topJSON
	var out string
	func() {
		defer func() {
			if !healthy(snap, ranks) { // waitUntil failed the test
				t.Logf("gotrain top's last output:\n%s", out)
			}
		}()
		testkit.WaitFor(t, 90*time.Second, "the ranks' progress in gotrain top", func() bool { // process start may be slow on a loaded machine
			out = gotrainTop(t, r, "--once", "--json")
			snap = topJSON{}
			if err := json.Unmarshal([]byte(out), &snap); err != nil {
				t.Fatalf("gotrain top --once --json does not parse: %v\n%s", err, out)
			}
			return healthy(snap, ranks)
		})
	}()
	seen := map[int]bool{}
	for _, rk := range snap.Ranks {
		seen[rk.Rank] = true
		lc := rk.LastCollective
		if rk.Host == "" || rk.GPU != -1 || rk.State != "running" || rk.PID <= 0 || rk.GPUSample != nil ||
			lc.Comm != "hang" || lc.Op != "allreduce" || lc.Seq <= 0 || (lc.State != "completed" && lc.State != "waiting") {
			t.Errorf("rank %d in gotrain top: %+v (last collective %+v)", rk.Rank, rk, lc)
		}
	}
	if len(seen) != ranks || snap.WorldSize != ranks || !strings.HasPrefix(snap.RunID, "gotrain-") {
		t.Errorf("gotrain top: %s", out)
	}

	// The table for people.
	table := gotrainTop(t, r, "--once")
	for _, want := range []string{"RANK", "STEP/S", "LAST COLLECTIVE", "allreduce #"} {
		if !strings.Contains(table, want) {
			t.Errorf("gotrain top --once lacks %q:\n%s", want, table)
		}
	}

	// /metrics, parsed with Prometheus' text parser.
	fams := scrapeMetrics(t, addr)
	for name, want := range map[string]float64{"gotrain_job_world_size": ranks, "gotrain_job_generation": 0, "gotrain_job_restarts": 0} {
		if got := gaugeOf(t, fams, name, nil); got != want {
			t.Errorf("%s = %v, want %v", name, got, want)
		}
	}
	if got := gaugeOf(t, fams, "gotrain_job_state", map[string]string{"state": "running"}); got != 1 {
		t.Errorf(`gotrain_job_state{state="running"} = %v, want 1`, got)
	}
	for rank := range ranks {
		l := map[string]string{"rank": strconv.Itoa(rank), "gpu": ""}
		if got := gaugeOf(t, fams, "gotrain_rank_running", l); got != 1 {
			t.Errorf("rank %d: gotrain_rank_running = %v, want 1", rank, got)
		}
		if got := gaugeOf(t, fams, "gotrain_rank_step", l); got < 3 {
			t.Errorf("rank %d: gotrain_rank_step = %v, want at least 3", rank, got)
		}
		if got := gaugeOf(t, fams, "gotrain_rank_steps_per_second", l); got <= 0 {
			t.Errorf("rank %d: gotrain_rank_steps_per_second = %v, want > 0", rank, got)
		}
		if got := gaugeOf(t, fams, "gotrain_rank_collectives_completed", l); got < 1 {
			t.Errorf("rank %d: gotrain_rank_collectives_completed = %v", rank, got)
		}
		gaugeOf(t, fams, "gotrain_rank_seconds_since_progress", l)
	}
	if f := fams["gotrain_gpu_temperature_celsius"]; f != nil && len(f.GetMetric()) > 0 {
		t.Errorf("a CPU job has GPU metrics: %v", f)
	}
}

func scrapeMetrics(t *testing.T, addr string) map[string]*dto.MetricFamily {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, "GET", fmt.Sprintf("http://%s/metrics", addr), nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("GET /metrics: %v", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /metrics: %d, %v\n%s", resp.StatusCode, err, body)
	}
	p := expfmt.NewTextParser(model.LegacyValidation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(string(body)))
	if err != nil {
		t.Fatalf("parse /metrics: %v\n%s", err, body)
	}
	return fams
}

// gaugeOf returns the gauge of family name whose labels include want,
// failing the test when there is none.
func gaugeOf(t *testing.T, fams map[string]*dto.MetricFamily, name string, want map[string]string) float64 {
	t.Helper()
	f := fams[name]
	if f == nil {
		t.Errorf("/metrics has no %s", name)
		return -1
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
		return m.GetGauge().GetValue()
	}
	t.Errorf("/metrics has no %s%v:\n%v", name, want, f)
	return -1
}

// A PyTorch program's optimizer steps, counted by gotrain's hook, are its
// STEP, STEP/S and SINCE PROGRESS in `gotrain top`, beside the collectives
// the hook counts on gloo and the CPU its process uses.
func TestTopShowsPyTorchSteps(t *testing.T) {
	t.Parallel()
	path := needTorch(t)
	const ranks = 2
	runtimeDir := t.TempDir()
	r := startLaunchEnv(t, []string{"XDG_RUNTIME_DIR=" + runtimeDir, path}, "launch", "--nproc-per-node", strconv.Itoa(ranks), "--backend", "cpu",
		"--max-restarts", "0", "--grace-period", "1s", "--",
		testdata(t, "gloo_hang.py"), "--fault", "none", "--step-time", "0.05")
	testkit.WaitFor(t, 60*time.Second, "the run file", func() bool {
		files, _ := filepath.Glob(filepath.Join(runtimeDir, "gotrain", "*.json"))
		return len(files) > 0
	})
	var snap topJSON
	var out string
	ok := func() bool {
		if snap.State != "running" || len(snap.Ranks) != ranks {
			return false
		}
		for _, rk := range snap.Ranks {
			if rk.Attached || rk.StepSource != "torch-hook" || rk.Step < 3 || rk.StepsPerSecond <= 0 || rk.SinceProgressSeconds == nil || rk.CPUPercent == nil ||
				rk.LastCollective == nil || rk.LastCollective.Comm != "torch-default-pg" {
				return false
			}
		}
		return true
	}
	func() {
		defer func() {
			if !ok() {
				t.Logf("gotrain top's last output:\n%s", out)
			}
		}()
		testkit.WaitFor(t, 3*time.Minute, "the PyTorch ranks' steps in gotrain top", func() bool { // two interpreters importing torch on a loaded machine
			out = gotrainTop(t, r, "--once", "--json")
			snap = topJSON{}
			if err := json.Unmarshal([]byte(out), &snap); err != nil {
				t.Fatalf("gotrain top --once --json does not parse: %v\n%s", err, out)
			}
			return ok()
		})
	}()
	table := gotrainTop(t, r, "--once")
	if !regexp.MustCompile(`(?m)^0 .* \d+ +\d+\.\d\d +\d`).MatchString(table) {
		t.Errorf("gotrain top --once shows no step, rate and time since progress for rank 0:\n%s", table)
	}
}
