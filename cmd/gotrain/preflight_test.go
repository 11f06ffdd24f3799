package main

import (
	"strings"
	"testing"

	"github.com/gotrain/gotrain/cmd/gotrain/internal/doctor"
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
