package benchrun_test

// Runs the real gotrain binary: `gotrain bench` on the CPU backend starts its
// workers through the launcher, and its --json output is parsed.

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gotrain/gotrain/cmd/gotrain/internal/benchrun"
)

func buildGotrain(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "gotrain")
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/gotrain")
	cmd.Dir = "../../../.."
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build gotrain: %v\n%s", err, out)
	}
	return bin
}

func runGotrain(t *testing.T, bin string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("gotrain %v: %v", args, err)
	}
	return o.String(), e.String(), code
}

func TestBenchCPUBinary(t *testing.T) {
	if testing.Short() {
		t.Skip("skipping: builds and runs the gotrain binary")
	}
	bin := buildGotrain(t)
	for _, tc := range []struct {
		op     string
		extra  []string
		factor float64
	}{
		{benchrun.AllReduce, nil, 1},
		{benchrun.AllGather, []string{"--dtype", "int32"}, 0.5},
		{benchrun.ReduceScatter, []string{"--op", "max", "--dtype", "float64"}, 0.5},
		{benchrun.Broadcast, []string{"--root", "1"}, 1},
	} {
		t.Run(tc.op, func(t *testing.T) {
			args := append([]string{"bench", tc.op, "--backend", "cpu", "--gpus", "2", "--min", "8", "--max", "256K", "--iters", "3", "--warmup", "1", "--json"}, tc.extra...)
			stdout, stderr, code := runGotrain(t, bin, args...)
			if code != 0 {
				t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
			}
			var rows []benchrun.Row
			if err := json.Unmarshal([]byte(stdout), &rows); err != nil {
				t.Fatalf("stdout is not a JSON array of rows: %v\n%s", err, stdout)
			}
			if len(rows) != 8 || rows[7].Bytes != 128<<10 { // 8 B … 128 KiB by ×4
				t.Fatalf("%d rows, want 8:\n%s", len(rows), stdout)
			}
			for i, r := range rows {
				if r.Op != tc.op || r.Ranks != 2 || r.Backend != "cpu" || r.Wrong != 0 || r.TimeUs <= 0 || r.Count <= 0 {
					t.Errorf("row %d: %+v", i, r)
				}
				if i > 0 && r.Bytes <= rows[i-1].Bytes {
					t.Errorf("row %d: %d bytes after %d", i, r.Bytes, rows[i-1].Bytes)
				}
				if d := r.BusBW - r.AlgBW*tc.factor; d > 1e-9*r.AlgBW || -d > 1e-9*r.AlgBW {
					t.Errorf("row %d: busbw %v is not algbw %v × %v", i, r.BusBW, r.AlgBW, tc.factor)
				}
			}
		})
	}
	t.Run("table", func(t *testing.T) {
		stdout, stderr, code := runGotrain(t, bin, "bench", "allreduce", "--backend", "cpu", "--gpus", "2", "--max", "1K", "--iters", "2")
		if code != 0 || !strings.Contains(stdout, "# gotrain bench allreduce: 2 ranks, backend cpu") || !strings.Contains(stdout, "Out of bounds values : 0 OK") {
			t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
		}
	})
	t.Run("NoGPUsSaysWhatIsMissing", func(t *testing.T) {
		if _, err := os.Stat("/dev/nvidia0"); err == nil {
			t.Skip("skipping: this machine has a GPU")
		}
		stdout, stderr, code := runGotrain(t, bin, "bench", "allreduce")
		if code == 0 || stdout != "" || !strings.Contains(stderr, "no NVIDIA GPU") || !strings.Contains(stderr, "--backend cpu") {
			t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
		}
	})
	t.Run("BadFlags", func(t *testing.T) {
		_, stderr, code := runGotrain(t, bin, "bench", "alltoall", "--backend", "cpu")
		if code != 2 || !strings.Contains(stderr, "unknown collective") {
			t.Fatalf("exit %d\nstderr:\n%s", code, stderr)
		}
	})
}
