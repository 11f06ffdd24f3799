package main

// Tests that build the real gotrain binary and run it on a machine without
// an NVIDIA driver (CI): topo and doctor must answer in one plain line.

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/gotrain/gotrain/cmd/gotrain/internal/doctor"
	"github.com/gotrain/gotrain/internal/gpu/gpuinfo"
)

func buildGotrain(t *testing.T) string {
	t.Helper()
	if n, err := gpuinfo.Open(); err == nil {
		n.Close()
		t.Skip("skipping: this machine has an NVIDIA driver")
	} else if !errors.Is(err, gpuinfo.ErrNoDriver) {
		t.Skipf("skipping: NVML fails in another way here: %v", err)
	}
	return buildBinary(t)
}

// buildBinary builds gotrain once per test binary.
func buildBinary(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("skipping: builds the binary")
	}
	builtOnce.Do(func() {
		dir, err := os.MkdirTemp("", "gotrain-cmd-test-")
		if err != nil {
			builtErr = err
			return
		}
		builtBin = filepath.Join(dir, "gotrain")
		if out, err := exec.Command("go", "build", "-o", builtBin, ".").CombinedOutput(); err != nil {
			builtErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if builtErr != nil {
		t.Fatal(builtErr)
	}
	return builtBin
}

var (
	builtOnce sync.Once
	builtBin  string
	builtErr  error
)

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
		{[]string{"doctor"}, 1, "FAIL  driver            no NVIDIA driver found (libnvidia-ml.so.1 not loadable)\n" +
			"                        fix: " + doctor.NoDriverFix + "\n\n" +
			"gotrain doctor: 1 check(s) failed, 0 warning(s): fix the FAIL lines above\n", ""},
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

// Without a driver, doctor --json prints exactly one JSON object, the
// report: unhealthy, the reason, and a fix whose commands name flags those
// commands have; it exits 1 and says nothing on stderr.
func TestDoctorJSONNoDriver(t *testing.T) {
	bin := buildGotrain(t)
	stdout, stderr, code := runGotrain(t, bin, "doctor", "--json")
	if code != 1 || stderr != "" {
		t.Errorf("exit %d, stderr %q; want exit 1, nothing on stderr", code, stderr)
	}
	dec := json.NewDecoder(strings.NewReader(stdout))
	var rep doctor.Report
	if err := dec.Decode(&rep); err != nil {
		t.Fatalf("stdout is not a JSON object: %v\n%s", err, stdout)
	}
	if _, err := dec.Token(); err != io.EOF {
		t.Errorf("more than one JSON value on stdout (next: %v):\n%s", err, stdout)
	}
	if rep.Healthy || len(rep.Checks) != 1 || rep.Checks[0].Status != doctor.Fail || !strings.Contains(rep.Checks[0].Detail, "no NVIDIA driver found") {
		t.Errorf("report %+v; want healthy false and one failed check saying there is no driver", rep)
	}
	for _, c := range rep.Checks {
		checkHintFlags(t, bin, c.Fix)
	}
}
