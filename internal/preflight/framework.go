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
import json, sys, time
copy_mib = int(sys.argv[1]) if len(sys.argv) > 1 else 0
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
out["copy"] = []
for i in range(out["count"] if copy_mib > 0 else 0):
    try:
        dev = torch.device("cuda:%d" % i)
        n = copy_mib << 20
        h = torch.empty(n, dtype=torch.uint8, pin_memory=True)
        d = torch.empty(n, dtype=torch.uint8, device=dev)
        def best(f):
            f()
            t = 1e9
            for _ in range(3):
                torch.cuda.synchronize(dev)
                s = time.perf_counter()
                f()
                torch.cuda.synchronize(dev)
                t = min(t, time.perf_counter() - s)
            return n / t / 1e9
        h2d = best(lambda: d.copy_(h, non_blocking=True))
        d2h = best(lambda: h.copy_(d, non_blocking=True))
        out["copy"].append({"h2d": h2d, "d2h": d2h})
        del h, d
    except Exception as e:
        out["copy"].append({"error": "%s: %s" % (type(e).__name__, e)})
print(json.dumps(out))
`

// CopyResult is one GPU's pinned host↔device copy rates (GB/s), or why
// they could not be measured.
type CopyResult struct {
	H2D   float64 `json:"h2d"`
	D2H   float64 `json:"d2h"`
	Error string  `json:"error"`
}

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
	// Copy: each GPU's pinned copies, when the check was asked to time
	// them (FrameworkConfig.CopyMiB).
	Copy []CopyResult `json:"copy"`
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
	// CopyMiB, when above 0, has each GPU's pinned host↔device copies of
	// this size timed (best of three, after one).
	CopyMiB int
}

// RunFramework runs the framework script and returns its report.
func RunFramework(ctx context.Context, cfg FrameworkConfig) (FrameworkReport, error) {
	if cfg.Timeout == 0 {
		cfg.Timeout = 60 * time.Second // importing torch on a cold file cache takes tens of seconds
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, cfg.Python, "-c", frameworkScript, strconv.Itoa(max(cfg.CopyMiB, 0)))
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
	if r.Count < 0 || r.Count > 1024 || len(r.Matmul) > r.Count || len(r.Copy) > r.Count {
		return r, fmt.Errorf("preflight: the framework check reported %d GPUs, %d matmuls and %d copies", r.Count, len(r.Matmul), len(r.Copy))
	}
	for _, c := range r.Copy {
		if !(c.H2D >= 0 && c.D2H >= 0) || c.H2D > 1e6 || c.D2H > 1e6 {
			return r, fmt.Errorf("preflight: the framework check reported copy rates %v and %v GB/s", c.H2D, c.D2H)
		}
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

// CopyFigures judges each GPU's pinned host↔device copies (the slower
// direction) against floor GB/s (H2DFloor of the node's links).
func CopyFigures(r FrameworkReport, floor float64) []Figure {
	var figs []Figure
	for i, c := range r.Copy {
		subject := fmt.Sprintf("GPU %d", i)
		if c.Error != "" {
			figs = append(figs, Figure{Check: CheckH2D, Subject: subject, Failed: true, Detail: "pinned copies failed: " + c.Error})
			continue
		}
		dir, rate := "host→device", c.H2D
		if c.D2H < rate {
			dir, rate = "device→host", c.D2H
		}
		figs = append(figs, Figure{Check: CheckH2D, Subject: subject, Measured: rate, Want: floor, Unit: "GB/s", Detail: dir + ", pinned"})
	}
	return figs
}

// pcieLaneGBps is one lane's usable rate by PCIe generation (GB/s, after
// the line code).
var pcieLaneGBps = map[int]float64{1: 0.25, 2: 0.5, 3: 0.985, 4: 1.969, 5: 3.938, 6: 7.563}

// H2DFloor is the least pinned host↔device copy rate (GB/s) a GPU on a
// link of generation gen and width lanes should reach: 40% of the link's
// rate (healthy GPUs do 80–90%: 54.8 of 63 GB/s measured on an H100 at
// Gen5 x16), so that it fails a link that trained down, a retimer or an
// IOMMU that throttles, or memory on the far socket, not one a little
// slow. With the link unknown (0), 3 GB/s: below any x16 link since Gen2.
func H2DFloor(gen, lanes int) float64 {
	lane, ok := pcieLaneGBps[gen]
	if !ok || lanes <= 0 {
		return 3
	}
	return 0.4 * lane * float64(lanes)
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
