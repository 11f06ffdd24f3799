package main

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/gotrain/gotrain/cmd/gotrain/internal/doctor"
	"github.com/gotrain/gotrain/internal/nodehealth"
	"github.com/gotrain/gotrain/internal/preflight"
)

func TestPreflightLevel(t *testing.T) {
	for _, tc := range []struct {
		given   string
		nodes   int
		backend string
		want    preflight.Level
		note    bool
	}{
		{"", 4, "nccl", preflight.Quick, false},
		{"", 1, "nccl", preflight.Off, true},
		{"", 4, "cpu", preflight.Off, false},
		{"", 1, "cpu", preflight.Off, false},
		{"quick", 1, "cpu", preflight.Quick, false},
		{"full", 1, "nccl", preflight.Full, false},
		{"off", 8, "nccl", preflight.Off, false},
	} {
		got, note, err := preflightLevel(tc.given, tc.nodes, tc.backend)
		if err != nil || got != tc.want || (note != "") != tc.note {
			t.Errorf("preflightLevel(%q, %d, %s) = %q, %q, %v; want %q (a note: %v)", tc.given, tc.nodes, tc.backend, got, note, err, tc.want, tc.note)
		}
		if tc.note && !strings.Contains(note, "--preflight quick") {
			t.Errorf("the note %q does not say how to ask", note)
		}
	}
	if _, _, err := preflightLevel("thorough", 2, "nccl"); err == nil {
		t.Error("--preflight thorough: want an error")
	}
}

// TestDoctorFigures: doctor's failed checks become failed figures with
// doctor's fix; the rest pass; checks preflight does not judge are left out.
func TestDoctorFigures(t *testing.T) {
	rep := &doctor.Report{Checks: []doctor.Check{
		{Name: "driver", Status: doctor.OK, Detail: "550.54"},
		{Name: "pcie", Status: doctor.Fail, Detail: "GPU1: x8 of x16", Fix: "reseat"},
		{Name: "throttle", Status: doctor.Warn, Detail: "sw_power_cap"},
		{Name: "processes", Status: doctor.Warn, Detail: "pid 77"},
		{Name: "smoke", Status: doctor.OK},
	}, Smoke: &doctor.SmokeResult{AllReduce: &doctor.AllReduceResult{GPUs: 2, Bytes: 256 << 20, BusBW: 3}}}
	res := preflight.Judge("n", doctorFigures(rep, preflight.Full))
	if len(res.Verdicts) != 4 {
		t.Fatalf("%d verdicts, want driver, pcie, throttle and the NCCL all-reduce: %+v", len(res.Verdicts), res.Verdicts)
	}
	failed := res.Failed()
	if len(failed) != 2 || failed[0].Check != preflight.CheckPCIe || failed[0].Fix != "reseat" || failed[1].Check != preflight.CheckNCCL {
		t.Errorf("failed %+v: want the PCIe link (doctor's fix) and the NCCL bus bandwidth below 5 GB/s", failed)
	}
	if quick := doctorFigures(rep, preflight.Quick); len(quick) != 3 {
		t.Errorf("quick: %d figures, want no NCCL figure", len(quick))
	}
}

// TestPreflightCoolOff: a machine whose health record holds two failures
// within the window stays out of an elastic job, before it contacts the
// coordinator (there is none at the address given), exits 4 with one line,
// and doctor --history says the same.
func TestPreflightCoolOff(t *testing.T) {
	bin := buildGotrain(t)
	state := t.TempDir()
	host, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	l := nodehealth.Open(nodehealth.DefaultPath(func(k string) string {
		if k == "XDG_STATE_HOME" {
			return state
		}
		return ""
	}))
	now := time.Now()
	for _, ago := range []time.Duration{2 * time.Hour, 10 * time.Minute} {
		if err := l.Append(nodehealth.Record{Time: now.Add(-ago), Host: host, Kind: nodehealth.Preflight, Check: "cpu-allreduce-bandwidth", Detail: "11 MB/s"}); err != nil {
			t.Fatal(err)
		}
	}
	run := func(args ...string) (string, string, int) {
		cmd := exec.CommandContext(t.Context(), bin, args...)
		cmd.Env = append(os.Environ(), "XDG_STATE_HOME="+state, "GOTRAIN_JOB_TOKEN=0123456789abcdef0123456789abcdef")
		var o, e bytes.Buffer
		cmd.Stdout, cmd.Stderr = &o, &e
		err := cmd.Run()
		var ee *exec.ExitError
		if err != nil && !errors.As(err, &ee) {
			t.Fatal(err)
		}
		return o.String(), e.String(), cmd.ProcessState.ExitCode()
	}
	_, stderr, code := run("launch", "--nnodes", "2:3", "--coordinator", "127.0.0.1:1", "--ca-hash", "sha256:"+strings.Repeat("ab", 32),
		"--backend", "cpu", "--nproc-per-node", "1", "--preflight", "quick", "--", "/bin/true")
	if code != 4 || !strings.Contains(stderr, "failed 2 times within 24h0m0s") || !strings.Contains(stderr, "stays out of elastic jobs") || strings.Contains(stderr, "waiting for the coordinator") {
		t.Errorf("exit %d, stderr:\n%s\nwant exit 4 and the cool-off line, without contacting the coordinator", code, stderr)
	}
	stdout, _, code := run("doctor", "--history")
	if code != 0 || !strings.Contains(stdout, "stays out of elastic jobs") || strings.Count(stdout, "cpu-allreduce-bandwidth") < 2 {
		t.Errorf("doctor --history: exit %d\n%s", code, stdout)
	}
}
