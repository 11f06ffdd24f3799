package integration

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Every restart timed, phase by phase (internal/launcher/recovery): a real gloo DDP
// program, one rank SIGKILLed mid-run, restarts on the Python standbys,
// which had preloaded what the first attempt imported (yaml); the agent's
// line names every phase, from the kill to the first step after the
// restore the program reported to the torch hook, and recovery.json in
// the log dir holds the same.
func TestRecoveryTimedPhaseByPhase(t *testing.T) {
	t.Parallel()
	prog := testdata(t, "recovery_prog.py")
	dir, logDir := t.TempDir(), t.TempDir()
	j := startTorchJob(t, dir, "launch", "--log-format", "json", "--nproc-per-node", "2", "--backend", "cpu", "--max-restarts", "1",
		"--standby=auto", "--log-dir", logDir, "--", "python3", prog)
	pids := regexp.MustCompile(`(?m)^\[rank 1\] run rank=1 restart=0 pid=(\d+)`)
	var victim int
	j.waitStderr(t, "both ranks stepping, the standbys ready and preloaded", func(string) bool {
		out, errs := peopleLines(t, j.out.String()), peopleLines(t, j.err.String())
		m := pids.FindStringSubmatch(out)
		if m == nil || !strings.Contains(out, "stepped rank=0 restart=0") || !strings.Contains(out, "stepped rank=1 restart=0") ||
			strings.Count(errs, `"msg":"python standby preloaded"`) < 2 {
			return false
		}
		victim, _ = strconv.Atoi(m[1])
		return true
	})
	if !regexp.MustCompile(`(?m)^gotrain: Python standbys preload yaml from the job's first attempt$`).MatchString(peopleLines(t, j.err.String())) {
		t.Errorf("no line saying what the standbys preload\nstderr:\n%s", j.err.String())
	}
	if err := syscall.Kill(victim, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if code := j.wait(t, 5*time.Minute); code != 0 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, j.out.String(), j.err.String())
	}
	// Every line is JSON (--log-format json); read back as people would see them.
	out, errs := peopleLines(t, j.out.String()), peopleLines(t, j.err.String())
	for _, r := range []string{"0", "1"} {
		if !strings.Contains(out, "run rank="+r+" restart=1 pid=") || !strings.Contains(out, "] run rank="+r+" restart=1 pid=") {
			t.Errorf("rank %s did not run again\nstdout:\n%s", r, out)
		}
		if !regexp.MustCompile(`run rank=` + r + ` restart=1 pid=\d+ yaml_warm=True`).MatchString(out) {
			t.Errorf("restarted rank %s did not find yaml imported by its standby\nstdout:\n%s", r, out)
		}
	}
	line := regexp.MustCompile(`(?m)^gotrain: recovered in [0-9.]+ s: detected [0-9.]+ · stopped [0-9.]+ · (rendezvous [0-9.]+ · )?started [0-9.]+ \(standby\) · ` +
		`imports [0-9.]+ · init_process_group [0-9.]+ · (setup [0-9.]+ · )?restored 1 MB from agent memory [0-9.]+ · first step [0-9.]+$`)
	if !line.MatchString(errs) {
		t.Errorf("no recovery line with every phase\nstderr:\n%s", errs)
	}
	t.Log(line.FindString(errs))
	// The same as a record, for log collectors.
	var record map[string]any
	for l := range strings.Lines(errs) {
		if strings.Contains(l, `"msg":"recovered"`) {
			if err := json.Unmarshal([]byte(l), &record); err != nil {
				t.Fatalf("%v: %s", err, l)
			}
		}
	}
	for _, k := range []string{"seconds", "detected", "stopped", "started", "imports", "init_process_group", "restored", "first_step", "restore_bytes"} {
		if _, ok := record[k].(float64); !ok {
			t.Errorf("the recovered record has no %s: %v", k, record)
		}
	}
	if record["start"] != "standby" {
		t.Errorf("the recovered record: start %v, want standby", record["start"])
	}
	files, _ := filepath.Glob(filepath.Join(logDir, "*", "attempt-*", "recovery.json"))
	if len(files) != 1 {
		t.Fatalf("recovery.json in the log dir: %v", files)
	}
	b, err := os.ReadFile(files[0])
	if err != nil {
		t.Fatal(err)
	}
	var rec struct {
		Recoveries []struct {
			Generation int64   `json:"generation"`
			Seconds    float64 `json:"seconds"`
			Phases     []struct {
				Name    string  `json:"name"`
				Seconds float64 `json:"seconds"`
				Detail  string  `json:"detail"`
			} `json:"phases"`
			Restore *struct {
				Bytes int64 `json:"bytes"`
				Step  int64 `json:"step"`
			} `json:"restore"`
			Missing []string `json:"missing"`
		} `json:"recoveries"`
	}
	if err := json.Unmarshal(b, &rec); err != nil || len(rec.Recoveries) != 1 {
		t.Fatalf("recovery.json: %v\n%s", err, b)
	}
	r := rec.Recoveries[0]
	var names []string
	for _, p := range r.Phases {
		names = append(names, p.Name)
	}
	for _, want := range []string{"detected", "stopped", "started", "imports", "init_process_group", "restored", "first step"} {
		if !strings.Contains(","+strings.Join(names, ",")+",", ","+want+",") {
			t.Errorf("recovery.json has no %s phase: %s", want, b)
		}
	}
	if r.Seconds <= 0 || r.Restore == nil || r.Restore.Bytes != 1<<20 || r.Restore.Step != 3 || len(r.Missing) > 0 {
		t.Errorf("recovery.json: %s", b)
	}
	// root-cause.json, written as the job ends, carries them too.
	b, err = os.ReadFile(filepath.Join(filepath.Dir(files[0]), "root-cause.json"))
	if err != nil {
		t.Fatal(err)
	}
	var rc struct {
		Succeeded  bool              `json:"succeeded"`
		Recoveries []json.RawMessage `json:"recoveries"`
	}
	if err := json.Unmarshal(b, &rc); err != nil || !rc.Succeeded || len(rc.Recoveries) != 1 {
		t.Errorf("root-cause.json: %v\n%s", err, b)
	}
}

// peopleLines reads --log-format json output back into the lines the people
// format prints: a worker's line "[rank N] …", gotrain's "gotrain: …"; a log
// record stays JSON. A line that is no JSON object fails the test.
func peopleLines(t *testing.T, s string) string {
	t.Helper()
	var b strings.Builder
	for line := range strings.Lines(s) {
		if !strings.HasSuffix(line, "\n") {
			continue // still being written
		}
		var r struct {
			Level, Msg, Source string
			Rank               *int
		}
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Errorf("--log-format json: a line that is no JSON object: %q (%v)", line, err)
			continue
		}
		switch {
		case r.Source == "worker" && r.Rank != nil:
			fmt.Fprintf(&b, "[rank %d] %s\n", *r.Rank, r.Msg)
		case r.Source == "gotrain" && r.Level == "WARN":
			fmt.Fprintf(&b, "gotrain: warning: %s\n", r.Msg)
		case r.Source == "gotrain":
			fmt.Fprintf(&b, "gotrain: %s\n", r.Msg)
		default:
			b.WriteString(line)
		}
	}
	return b.String()
}
