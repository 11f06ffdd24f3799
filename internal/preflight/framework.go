package preflight

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os/exec"
	"strconv"
	"strings"
	"time"
)

// frameworkScript is the framework check, run by the interpreter workers
// will use. It is ours, fixed at build time: nothing another process served
// is run. It prints one JSON object and nothing else on stdout.
const frameworkScript = `
import json, sys
out = {"python": sys.version.split()[0]}
try:
    import torch
except Exception as e:
    out["import_error"] = "%s: %s" % (type(e).__name__, e)
    print(json.dumps(out)); sys.exit(0)
out["torch"] = torch.__version__
out["cuda_build"] = torch.version.cuda or ""
try:
    out["available"] = bool(torch.cuda.is_available())
    out["count"] = torch.cuda.device_count() if out["available"] else 0
except Exception as e:
    out["available"], out["count"], out["cuda_error"] = False, 0, "%s: %s" % (type(e).__name__, e)
out["matmul"] = []
for i in range(out["count"]):
    try:
        a = torch.ones(256, 256, device="cuda:%d" % i)
        ok = float((a @ a)[0, 0].item()) == 256.0
        out["matmul"].append("" if ok else "wrong result")
    except Exception as e:
        out["matmul"].append("%s: %s" % (type(e).__name__, e))
print(json.dumps(out))
`

// maxFrameworkOutput bounds what is read of the script's output.
const maxFrameworkOutput = 64 << 10

// FrameworkReport is what the framework script printed.
type FrameworkReport struct {
	Python      string   `json:"python"`
	ImportError string   `json:"import_error"`
	Torch       string   `json:"torch"`
	CUDABuild   string   `json:"cuda_build"`
	Available   bool     `json:"available"`
	Count       int      `json:"count"`
	CUDAError   string   `json:"cuda_error"`
	Matmul      []string `json:"matmul"`
}

// FrameworkConfig says what the framework check runs and expects.
type FrameworkConfig struct {
	// Python is the interpreter workers run; Env their environment
	// (CUDA_VISIBLE_DEVICES included).
	Python string
	Env    []string
	// GPUs is how many GPUs each worker's torch should see together (the
	// node's GPUs the job uses); DriverCUDA the driver's CUDA version
	// ("12.4"; "" when unknown).
	GPUs       int
	DriverCUDA string
	Timeout    time.Duration
}

// RunFramework runs the framework script and returns its report.
func RunFramework(ctx context.Context, cfg FrameworkConfig) (FrameworkReport, error) {
	if cfg.Timeout == 0 {
		cfg.Timeout = 60 * time.Second // importing torch on a cold file cache takes tens of seconds
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, cfg.Python, "-c", frameworkScript)
	cmd.Env = cfg.Env
	var stderr bytes.Buffer
	cmd.Stderr = &limited{w: &stderr, n: 4 << 10}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return FrameworkReport{}, err
	}
	if err := cmd.Start(); err != nil {
		return FrameworkReport{}, fmt.Errorf("preflight: start %s: %w", cfg.Python, err)
	}
	out, _ := io.ReadAll(io.LimitReader(stdout, maxFrameworkOutput))
	_, _ = io.Copy(io.Discard, stdout)
	if err := cmd.Wait(); err != nil {
		return FrameworkReport{}, fmt.Errorf("preflight: %s ran the framework check: %w: %s", cfg.Python, err, strings.TrimSpace(stderr.String()))
	}
	return ParseFramework(out)
}

// ParseFramework reads the script's output, checking it: a report that
// does not parse, or is out of bounds, is an error.
func ParseFramework(out []byte) (FrameworkReport, error) {
	var r FrameworkReport
	line := bytes.TrimSpace(out)
	if i := bytes.LastIndexByte(line, '\n'); i >= 0 {
		line = line[i+1:] // a sitecustomize may print first: the report is the last line
	}
	if err := json.Unmarshal(line, &r); err != nil {
		return r, fmt.Errorf("preflight: the framework check's output is not its report: %w", err)
	}
	if r.Count < 0 || r.Count > 1024 || len(r.Matmul) > r.Count {
		return r, fmt.Errorf("preflight: the framework check reported %d GPUs and %d matmuls", r.Count, len(r.Matmul))
	}
	return r, nil
}

// FrameworkFigures judges what torch sees against the node: a CUDA build,
// no newer than the driver's CUDA, CUDA available, the GPUs all visible, a
// matmul right on each.
func FrameworkFigures(r FrameworkReport, gpus int, driverCUDA string) []Figure {
	fail := func(detail, fix string) []Figure {
		return []Figure{{Check: CheckFramework, Failed: true, Detail: detail, Fix: fix}}
	}
	switch {
	case r.ImportError != "":
		return fail("python "+r.Python+" cannot import torch ("+r.ImportError+")", "install torch for the interpreter the job runs, or run the job with that interpreter first on PATH")
	case r.CUDABuild == "":
		return fail("torch "+r.Torch+" was built without CUDA: the ranks would train on the CPU", "install a CUDA build of torch (one whose torch.version.cuda is at most the driver's CUDA version)")
	case driverCUDA != "" && newer(r.CUDABuild, driverCUDA):
		return fail(fmt.Sprintf("torch %s is built for CUDA %s, newer than the driver's CUDA %s", r.Torch, r.CUDABuild, driverCUDA),
			"upgrade the NVIDIA driver, or install a torch built for CUDA "+driverCUDA+" or older")
	case !r.Available:
		d := "torch.cuda.is_available() is False"
		if r.CUDAError != "" {
			d += " (" + r.CUDAError + ")"
		}
		return fail(d, "check CUDA_VISIBLE_DEVICES and that nvidia-smi works for this user")
	case r.Count < gpus:
		return []Figure{{Check: CheckFramework, Subject: "device count", Measured: float64(r.Count), Want: float64(gpus), Unit: "GPUs",
			Fix: "check CUDA_VISIBLE_DEVICES and the container's GPU devices: torch must see every GPU the job uses"}}
	}
	var figs []Figure
	for i, e := range r.Matmul {
		f := Figure{Check: CheckFramework, Subject: fmt.Sprintf("GPU %d", i), Detail: "matmul ok"}
		if e != "" {
			f.Failed, f.Detail = true, "a matmul failed: "+e
			f.Fix = "run `gotrain doctor` on this node: the GPU fails a simple computation"
		}
		figs = append(figs, f)
	}
	if len(figs) == 0 {
		figs = fail(fmt.Sprintf("torch sees %d GPUs but ran no matmul", r.Count), "")
	}
	return figs
}

// newer says whether CUDA version a ("12.4") is newer than b.
func newer(a, b string) bool {
	pa, pb := strings.Split(a, "."), strings.Split(b, ".")
	for i := range max(len(pa), len(pb)) {
		x, y := part(pa, i), part(pb, i)
		if x != y {
			return x > y
		}
	}
	return false
}

func part(p []string, i int) int {
	if i >= len(p) {
		return 0
	}
	n, _ := strconv.Atoi(p[i])
	return n
}

// limited writes at most n bytes to w and drops the rest.
type limited struct {
	w io.Writer
	n int
}

func (l *limited) Write(p []byte) (int, error) {
	if l.n > 0 {
		k := min(len(p), l.n)
		l.w.Write(p[:k])
		l.n -= k
	}
	return len(p), nil
}
