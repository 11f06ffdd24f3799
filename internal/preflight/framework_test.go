package preflight

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// TestFrameworkRealPython runs the check in this machine's python3, whose
// torch (if any) is a CPU build: the check must say the ranks would train on
// the CPU, or that torch is missing.
func TestFrameworkRealPython(t *testing.T) {
	py, err := exec.LookPath("/usr/bin/python3") // Debian's, with a CPU torch where installed
	if err != nil {
		py, err = exec.LookPath("python3")
	}
	if err != nil {
		t.Skip("no python3 here")
	}
	r, err := RunFramework(t.Context(), FrameworkConfig{Python: py, Env: os.Environ(), CopyMiB: 64})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%+v", r)
	if len(r.Copy) != 0 {
		t.Errorf("copies timed on a machine whose torch sees no GPU: %+v", r.Copy)
	}
	res := Judge("here", FrameworkFigures(r, 1, "12.4"))
	if res.Passed {
		t.Fatalf("a machine without a GPU passed the framework check: %+v", res.Verdicts)
	}
	v := res.Failed()[0]
	if !strings.Contains(v.Measured, "without CUDA") && !strings.Contains(v.Measured, "cannot import torch") && !strings.Contains(v.Measured, "is_available") {
		t.Errorf("verdict %+v: want torch without CUDA, missing, or CUDA unavailable", v)
	}
}

func TestFrameworkFigures(t *testing.T) {
	good := FrameworkReport{Python: "3.11", Torch: "2.4.0", CUDABuild: "12.1", Available: true, Count: 2, Matmul: []string{"", ""}}
	for _, tc := range []struct {
		name   string
		edit   func(*FrameworkReport)
		gpus   int
		driver string
		ok     bool
		want   string
	}{
		{"healthy", func(*FrameworkReport) {}, 2, "12.4", true, "matmul ok"},
		{"no torch", func(r *FrameworkReport) { r.ImportError = "ModuleNotFoundError: No module named 'torch'" }, 2, "12.4", false, "cannot import torch"},
		{"CPU wheel", func(r *FrameworkReport) { r.CUDABuild, r.Torch = "", "2.4.0+cpu" }, 2, "12.4", false, "built without CUDA"},
		{"torch newer than the driver", func(r *FrameworkReport) { r.CUDABuild = "12.6" }, 2, "12.4", false, "newer than the driver's CUDA 12.4"},
		{"driver CUDA 12.10 is newer than 12.6", func(r *FrameworkReport) { r.CUDABuild = "12.6" }, 2, "12.10", true, "matmul ok"},
		{"driver unknown", func(r *FrameworkReport) {}, 2, "", true, "matmul ok"},
		{"not available", func(r *FrameworkReport) { r.Available, r.Count, r.Matmul = false, 0, nil }, 2, "12.4", false, "is_available() is False"},
		{"a GPU hidden", func(r *FrameworkReport) { r.Count, r.Matmul = 1, []string{""} }, 2, "12.4", false, "1 GPUs"},
		{"a matmul fails", func(r *FrameworkReport) { r.Matmul[1] = "RuntimeError: CUDA error: an illegal memory access" }, 2, "12.4", false, "illegal memory access"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := good
			r.Matmul = append([]string(nil), good.Matmul...)
			tc.edit(&r)
			res := Judge("n", FrameworkFigures(r, tc.gpus, tc.driver))
			if res.Passed != tc.ok {
				t.Fatalf("passed %v, want %v: %+v", res.Passed, tc.ok, res.Verdicts)
			}
			found := false
			for _, v := range res.Verdicts {
				found = found || strings.Contains(v.Measured, tc.want)
				if !v.OK && v.Fix == "" {
					t.Errorf("%+v: a failure without a fix", v)
				}
			}
			if !found {
				t.Errorf("%+v: no verdict says %q", res.Verdicts, tc.want)
			}
		})
	}
}

func TestParseFramework(t *testing.T) {
	for _, bad := range []string{"", "not json", `{"count": -1}`, `{"count": 1, "matmul": ["", ""]}`, `{"count": 100000}`} {
		if _, err := ParseFramework([]byte(bad)); err == nil {
			t.Errorf("ParseFramework(%q): want an error", bad)
		}
	}
	r, err := ParseFramework([]byte("a line a sitecustomize printed\n{\"torch\": \"2.4.0\", \"count\": 1, \"matmul\": [\"\"]}\n"))
	if err != nil || r.Torch != "2.4.0" || r.Count != 1 {
		t.Errorf("got %+v, %v", r, err)
	}
}

func FuzzParseFramework(f *testing.F) {
	f.Add([]byte(`{"torch": "2.4.0", "count": 1, "matmul": [""]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := ParseFramework(b)
		if err == nil && (r.Count < 0 || len(r.Matmul) > r.Count) {
			t.Errorf("accepted %+v", r)
		}
	})
}

// TestCopyFigures: each GPU is judged by its slower direction against the
// floor; a GPU whose copies failed fails with the error.
func TestCopyFigures(t *testing.T) {
	r := FrameworkReport{Count: 3, Copy: []CopyResult{{H2D: 50, D2H: 48}, {H2D: 4, D2H: 30}, {Error: "RuntimeError: CUDA error: out of memory"}}}
	res := Judge("gpu-node", CopyFigures(r, H2DFloor(5, 16)))
	if res.Passed || len(res.Verdicts) != 3 {
		t.Fatalf("%+v: want 3 verdicts, not all passed", res.Verdicts)
	}
	v := res.Verdicts
	if !v[0].OK || !strings.Contains(v[0].Measured, "48 GB/s (device→host, pinned)") {
		t.Errorf("GPU 0: %+v: want a pass at 48 GB/s device→host", v[0])
	}
	if v[1].OK || !strings.Contains(v[1].Measured, "4 GB/s (host→device") || v[1].Check != CheckH2D {
		t.Errorf("GPU 1: %+v: want a failure at 4 GB/s host→device", v[1])
	}
	if v[2].OK || !strings.Contains(v[2].Measured, "out of memory") {
		t.Errorf("GPU 2: %+v: want the copies' error", v[2])
	}
	if got := len(CopyFigures(FrameworkReport{Count: 2}, 3)); got != 0 {
		t.Errorf("no copies timed: %d figures, want none", got)
	}
}

// TestH2DFloor: 40% of the link's rate, 3 GB/s when the link is unknown.
func TestH2DFloor(t *testing.T) {
	for _, tc := range []struct {
		gen, lanes int
		want       float64
	}{{5, 16, 25.2}, {4, 16, 12.6}, {3, 8, 3.15}, {0, 16, 3}, {5, 0, 3}, {9, 16, 3}} {
		if got := H2DFloor(tc.gen, tc.lanes); got < tc.want-0.05 || got > tc.want+0.05 {
			t.Errorf("H2DFloor(%d, %d) = %.2f, want %.2f", tc.gen, tc.lanes, got, tc.want)
		}
	}
}

// TestParseFrameworkRejectsBadCopies: copy rates come from another
// process: more of them than GPUs, negative or absurd ones, are refused.
func TestParseFrameworkRejectsBadCopies(t *testing.T) {
	for _, out := range []string{
		`{"count": 1, "copy": [{"h2d": 1, "d2h": 1}, {"h2d": 1, "d2h": 1}]}`,
		`{"count": 1, "copy": [{"h2d": -1, "d2h": 1}]}`,
		`{"count": 1, "copy": [{"h2d": 1, "d2h": 1e300}]}`,
	} {
		if _, err := ParseFramework([]byte(out)); err == nil {
			t.Errorf("%s: accepted", out)
		}
	}
	r, err := ParseFramework([]byte(`{"count": 1, "copy": [{"h2d": 51.5, "d2h": 49}]}`))
	if err != nil || r.Copy[0].H2D != 51.5 {
		t.Errorf("a good report: %+v, %v", r, err)
	}
}
