package main

// Tests that build the real gotrain binary and run it on a machine without
// an NVIDIA driver (CI): topo and doctor must answer in one plain line.

import (
	"bytes"
	"errors"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gotrain/gotrain/internal/gpuinfo"
)

func buildGotrain(t *testing.T) string {
	t.Helper()
	if n, err := gpuinfo.Open(); err == nil {
		n.Close()
		t.Skip("skipping: this machine has an NVIDIA driver")
	} else if !errors.Is(err, gpuinfo.ErrNoDriver) {
		t.Skipf("skipping: NVML fails in another way here: %v", err)
	}
	if testing.Short() {
		t.Skip("skipping: builds the binary")
	}
	bin := filepath.Join(t.TempDir(), "gotrain")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

func runGotrain(t *testing.T, bin string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	cmd := exec.CommandContext(t.Context(), bin, args...)
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		code = ee.ExitCode()
	case err != nil:
		t.Fatal(err)
	}
	return o.String(), e.String(), code
}

func TestNoDriver(t *testing.T) {
	bin := buildGotrain(t)
	for _, tc := range []struct {
		args           []string
		code           int
		stdout, stderr string
	}{
		{[]string{"doctor"}, 1, "", "gotrain doctor: no NVIDIA driver found (libnvidia-ml.so.1 not loadable): install the NVIDIA driver, or use --backend cpu\n"},
		{[]string{"doctor", "--json"}, 1, "", "gotrain doctor: no NVIDIA driver found (libnvidia-ml.so.1 not loadable): install the NVIDIA driver, or use --backend cpu\n"},
		{[]string{"topo"}, 0, "no NVIDIA GPUs found (NVML: libnvidia-ml.so.1 not loadable)\n", ""},
		{[]string{"topo", "--json"}, 0, `{"gpus":[],"matrix":[],"nvlink_order":[],"error":"no NVIDIA GPUs found (NVML: libnvidia-ml.so.1 not loadable)"}` + "\n", ""},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			stdout, stderr, code := runGotrain(t, bin, tc.args...)
			if code != tc.code || stdout != tc.stdout || stderr != tc.stderr {
				t.Errorf("exit %d, stdout %q, stderr %q\nwant exit %d, stdout %q, stderr %q", code, stdout, stderr, tc.code, tc.stdout, tc.stderr)
			}
		})
	}
}
