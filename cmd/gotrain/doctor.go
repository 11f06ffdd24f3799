package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/gotrain/gotrain/cmd/gotrain/internal/doctor"
	"github.com/gotrain/gotrain/gpu/cudadrv"
	"github.com/gotrain/gotrain/internal/gpu/gpuinfo"
	"github.com/gotrain/gotrain/internal/jobenv"
	"github.com/gotrain/gotrain/internal/launcher/placement"
	"github.com/gotrain/gotrain/internal/nodehealth"
	"github.com/gotrain/gotrain/worker/ncclcomm"
)

type doctorCmd struct{}

func (*doctorCmd) name() string { return "doctor" }
func (*doctorCmd) synopsis() string {
	return "check this node's GPUs, driver, NCCL and topology before training"
}

const doctorUsage = `
Usage: gotrain doctor [--json] [--no-smoke]
       gotrain doctor --history [--json]

Checks this node: the NVIDIA driver and the GPUs it shows (name, UUID, bus
id, memory), other processes holding GPU memory, NCCL and its version, ECC
and XID errors, throttling, temperature and power against their limits, the
NVLink/PCIe topology, a smoke test (a kernel on every GPU, an all-reduce
across all of them with its bandwidth) and that a worker started for GPU i
really runs on GPU i. Each problem comes with a fix.

--history prints this machine's health record instead: every verdict
against it (a failed preflight check, the node lost from a job, dropped as
a straggler, an XID in a failed job), kept in
$XDG_STATE_HOME/gotrain/node-health.jsonl (else
~/.local/state/gotrain/), and whether it is kept out of elastic jobs now
(after 2 failures within 24 h, for 6 h).

Examples:
  gotrain doctor
  gotrain doctor --json | jq .checks
  gotrain doctor --history

Exits 0 when every check passes (warnings allowed), 1 when one fails (a
machine without an NVIDIA driver fails the driver check: --json still
prints the report, with "healthy": false and the reason), 2 on a usage
error.
`

// doctorProbeEnv makes `gotrain doctor` print the PCI bus id of the CUDA
// device a worker for GOTRAIN_GPU would use (ncclcomm.DeviceFor) and exit:
// the worker-placement probe doctor starts of itself.
const doctorProbeEnv = "GOTRAIN_DOCTOR_PROBE"

// doctorExit is doctor's failure: the report on stdout said it (the FAIL
// lines, or "healthy": false); only the status is left, and nothing more is
// printed.
type doctorExit struct{}

func (doctorExit) Error() string { return "" }
func (doctorExit) ExitCode() int { return exitFailure }

func (c *doctorCmd) run(ctx context.Context, args []string) error {
	if os.Getenv(doctorProbeEnv) == "1" {
		return doctorProbe()
	}
	fs := newFlagSet(c.name(), doctorUsage)
	asJSON := fs.Bool("json", false, "print the report as JSON")
	noSmoke := fs.Bool("no-smoke", false, "skip the smoke test and the worker probe (no CUDA work)")
	history := fs.Bool("history", false, "print this machine's health record (failed preflight checks, nodes lost, stragglers, XIDs) instead of checking it")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return &usageError{msg: fmt.Sprintf("unexpected argument %q", fs.Arg(0))}
	}
	if *history {
		return doctorHistory(*asJSON)
	}
	var rep *doctor.Report
	if n, err := gpuinfo.Open(); err != nil {
		rep = doctor.NoNVML(err)
	} else {
		defer n.Close()
		cfg := doctor.Config{NVML: n, NCCL: doctor.LoadNCCL}
		if !*noSmoke {
			cfg.Smoke = doctor.Smoke
			cfg.Probe = probeWorkerGPU
		}
		rep = doctor.Run(ctx, cfg)
	}
	var err error
	if *asJSON {
		err = printIndentedJSON(rep)
	} else {
		err = rep.WriteText(os.Stdout)
	}
	if err != nil {
		return err
	}
	if !rep.Healthy {
		return doctorExit{}
	}
	return nil
}

// probeWorkerGPU starts this binary as a worker for GPU gpu among gpus would
// be started (placement.WorkerGPUEnv, GOTRAIN_GPU) and returns the bus id of
// the device it picks.
func probeWorkerGPU(ctx context.Context, gpu int, gpus []int) (string, error) {
	self, err := os.Executable()
	if err != nil {
		return "", err
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, self, "doctor")
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "CUDA_VISIBLE_DEVICES=") && !strings.HasPrefix(kv, "CUDA_DEVICE_ORDER=") {
			env = append(env, kv)
		}
	}
	cmd.Env = append(append(env, doctorProbeEnv+"=1", jobenv.GPU+"="+strconv.Itoa(gpu)), placement.WorkerGPUEnv(gpus)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("%w: %s", err, strings.TrimSpace(stderr.String()))
	}
	return strings.TrimSpace(string(out)), nil
}

// doctorProbe is the probe's side: print the bus id of the CUDA device a
// worker for GOTRAIN_GPU uses.
func doctorProbe() error {
	drv, err := cudadrv.Load()
	if err != nil {
		return err
	}
	gpu, err := strconv.Atoi(os.Getenv(jobenv.GPU))
	if err != nil {
		return fmt.Errorf("doctor probe: %s=%q: %w", jobenv.GPU, os.Getenv(jobenv.GPU), err)
	}
	dev, err := drv.Device(ncclcomm.DeviceFor(gpu, os.Getenv))
	if err != nil {
		return err
	}
	bus, err := dev.PCIBusID()
	if err != nil {
		return err
	}
	fmt.Println(bus)
	return nil
}

// doctorHistory prints this machine's node-health record.
func doctorHistory(asJSON bool) error {
	path := nodehealth.DefaultPath(os.Getenv)
	if path == "" {
		return &usageError{msg: "no state directory: neither XDG_STATE_HOME nor HOME is an absolute path", hint: "Set XDG_STATE_HOME (or HOME) to where gotrain keeps this machine's health record."}
	}
	recs, skipped, err := nodehealth.Open(path).Read()
	if err != nil {
		return err
	}
	host := hostnameOr("localhost")
	now := time.Now()
	if asJSON {
		d := nodehealth.Decide(recs, host, now, nodehealth.DefaultPolicy)
		if recs == nil {
			recs = []nodehealth.Record{}
		}
		out := struct {
			Path     string              `json:"path"`
			Host     string              `json:"host"`
			Records  []nodehealth.Record `json:"records"`
			Skipped  int                 `json:"skipped_lines"`
			Admitted bool                `json:"admitted"`
			Until    *time.Time          `json:"kept_out_until,omitempty"`
		}{Path: path, Host: host, Records: recs, Skipped: skipped, Admitted: d.Admit}
		if !d.Admit {
			out.Until = &d.Until
		}
		return printIndentedJSON(out)
	}
	return nodehealth.WriteHistory(os.Stdout, path, host, recs, skipped, now, nodehealth.DefaultPolicy)
}
