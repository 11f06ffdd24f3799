package preflight

import (
	"strings"
	"testing"
)

func TestJudge(t *testing.T) {
	for _, tc := range []struct {
		name     string
		fig      Figure
		ok       bool
		measured string
		expected string
		fix      string
	}{
		{"bandwidth above", Figure{Check: CheckCPUBusBW, Measured: 1450, Want: 50, Unit: "MB/s"}, true, "1.45e+03 MB/s", "at least 50 MB/s", ""},
		{"bandwidth below", Figure{Check: CheckCPUBusBW, Measured: 12.34, Want: 50, Unit: "MB/s", Detail: "2 ranks, 4 MiB"}, false, "12.3 MB/s (2 ranks, 4 MiB)", "at least 50 MB/s", defaultFix[CheckCPUBusBW]},
		{"bandwidth exactly at the gate", Figure{Check: CheckCPUBusBW, Measured: 50, Want: 50, Unit: "MB/s"}, true, "50 MB/s", "at least 50 MB/s", ""},
		{"latency under", Figure{Check: CheckCPULat, Measured: 0.04, Want: 50, Unit: "ms", AtMost: true}, true, "0.04 ms", "at most 50 ms", ""},
		{"latency over", Figure{Check: CheckCPULat, Measured: 210, Want: 50, Unit: "ms", AtMost: true}, false, "210 ms", "at most 50 ms", defaultFix[CheckCPULat]},
		{"out of time, bandwidth bound", Figure{Check: CheckCPUBusBW, Measured: 60, Want: 50, Unit: "MB/s", Below: true}, false, "< 60 MB/s", "at least 50 MB/s", defaultFix[CheckCPUBusBW]},
		{"out of time, latency bound", Figure{Check: CheckCPULat, Measured: 5000, Want: 50, Unit: "ms", AtMost: true, Below: true}, false, "> 5e+03 ms", "at most 50 ms", defaultFix[CheckCPULat]},
		{"yes/no passes", Figure{Check: CheckDriver, Detail: "driver 550.54"}, true, "driver 550.54", "", ""},
		{"yes/no fails with its own fix", Figure{Check: CheckFramework, Subject: "GPU 0", Failed: true, Detail: "torch 2.4.0+cpu has no CUDA", Fix: "pip install a CUDA torch"}, false, "torch 2.4.0+cpu has no CUDA", "", "pip install a CUDA torch"},
		{"PCIe figure", Figure{Check: CheckPCIe, Subject: "GPU 3", Measured: 8, Want: 16, Unit: "lanes"}, false, "8 lanes", "at least 16 lanes", defaultFix[CheckPCIe]},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res := Judge("node2", []Figure{tc.fig})
			if res.Passed != tc.ok || len(res.Verdicts) != 1 {
				t.Fatalf("passed %v with %d verdicts, want %v with 1", res.Passed, len(res.Verdicts), tc.ok)
			}
			v := res.Verdicts[0]
			if v.OK != tc.ok || v.Measured != tc.measured || v.Expected != tc.expected || v.Fix != tc.fix || v.Node != "node2" || v.Check != tc.fig.Check {
				t.Errorf("verdict %+v, want ok %v measured %q expected %q fix %q", v, tc.ok, tc.measured, tc.expected, tc.fix)
			}
		})
	}
}

func TestJudgeSeveral(t *testing.T) {
	res := Judge("n1", []Figure{
		{Check: CheckDriver},
		{Check: CheckCPUBusBW, Measured: 10, Want: 50, Unit: "MB/s"},
		{Check: CheckCPULat, Measured: 1, Want: 50, Unit: "ms", AtMost: true},
	})
	if res.Passed || len(res.Verdicts) != 3 {
		t.Fatalf("%+v: want failed with 3 verdicts", res)
	}
	if f := res.Failed(); len(f) != 1 || f[0].Check != CheckCPUBusBW {
		t.Errorf("failed %+v, want the bandwidth alone", f)
	}
	if res := Judge("n1", nil); !res.Passed {
		t.Errorf("no figures: %+v, want passed", res)
	}
}

func TestLine(t *testing.T) {
	v := Judge("gpu07", []Figure{{Check: CheckCPUBusBW, Subject: "loopback", Measured: 12.3, Want: 50, Unit: "MB/s"}}).Verdicts[0]
	for _, tc := range []struct {
		s    Scheduler
		want []string
	}{
		{Scheduler{Slurm: true}, []string{"node gpu07 failed cpu-allreduce-bandwidth on loopback", "measured 12.3 MB/s, expected at least 50 MB/s", "fix: ", "--exclude=gpu07"}},
		{Scheduler{Elastic: true}, []string{"node gpu07", "starts without this node"}},
		{Scheduler{}, []string{"node gpu07", "does not start", "--nnodes MIN:MAX"}},
		{Scheduler{Undecided: true, Slurm: true}, []string{"under --nnodes MIN:MAX", "fails before any step otherwise", "--exclude=gpu07"}},
	} {
		line := Line(v, tc.s)
		for _, w := range tc.want {
			if !strings.Contains(line, w) {
				t.Errorf("%+v: line %q lacks %q", tc.s, line, w)
			}
		}
		if strings.Contains(line, "\n") {
			t.Errorf("line %q is more than one line", line)
		}
	}
}

func TestParseLevel(t *testing.T) {
	for in, want := range map[string]Level{"quick": Quick, "FULL": Full, " off ": Off} {
		if got, err := ParseLevel(in); err != nil || got != want {
			t.Errorf("ParseLevel(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	if _, err := ParseLevel("fast"); err == nil || !strings.Contains(err.Error(), "quick, full or off") {
		t.Errorf("ParseLevel(fast): %v, want an error naming the levels", err)
	}
}
