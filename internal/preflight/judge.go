package preflight

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/gotrain/gotrain/internal/coordinator/job"
)

// Level is how much a node proves itself: the --preflight flag.
type Level string

// The levels. Off runs nothing; Quick fits in a few seconds; Full measures
// longer and with bigger buffers.
const (
	Off   Level = "off"
	Quick Level = "quick"
	Full  Level = "full"
)

// ParseLevel reads --preflight's value.
func ParseLevel(s string) (Level, error) {
	switch l := Level(strings.ToLower(strings.TrimSpace(s))); l {
	case Off, Quick, Full:
		return l, nil
	}
	return "", fmt.Errorf("--preflight %q: want quick, full or off (quick: a few seconds before the first step; full: longer measurements; off: none)", s)
}

// Check names a preflight check, as verdicts and the ledger name it.
type Check string

// The checks.
const (
	CheckDriver    Check = "driver"        // NVML starts, a driver is loaded
	CheckHealth    Check = "gpu-health"    // ECC, XID, throttle reasons
	CheckPCIe      Check = "pcie-link"     // link width and generation against the device's maximum
	CheckFramework Check = "framework"     // torch against the driver and the GPUs
	CheckH2D       Check = "h2d-bandwidth" // host↔device copies against the link
	CheckNCCL      Check = "nccl-allreduce"
	CheckCPUBusBW  Check = "cpu-allreduce-bandwidth"
	CheckCPULat    Check = "cpu-allreduce-latency"
	CheckGang      Check = "gang-allreduce"
)

// Figure is one thing a runner found: a measured figure with the figure it
// is expected to reach (Unit set), or a yes/no finding (Unit empty, Failed
// says whether it failed). Subject narrows the check to a part of the node
// ("GPU 3"); empty for the node as a whole.
type Figure struct {
	Check   Check
	Subject string
	// Measured and Want are the figure and its threshold in Unit. AtMost:
	// lower is better (a latency); otherwise higher is (a bandwidth).
	// Below says the measurement ran out of time before it finished, so
	// the true figure is at most Measured (at least, with AtMost).
	Measured, Want float64
	Unit           string
	AtMost         bool
	Below          bool
	// Failed is a yes/no check's outcome; Detail says what was found.
	Failed bool
	Detail string
	// Fix overrides the check's default fix.
	Fix string
}

// Verdict is the judge's word on one figure.
type Verdict struct {
	Node    string `json:"node"`
	Check   Check  `json:"check"`
	Subject string `json:"subject,omitempty"`
	OK      bool   `json:"ok"`
	// Measured and Expected are the figures as a person reads them
	// ("12.3 MB/s", "at least 50 MB/s"); Measured is the finding of a
	// yes/no check.
	Measured string `json:"measured"`
	Expected string `json:"expected,omitempty"`
	Fix      string `json:"fix,omitempty"`
}

// Result is every verdict on a node.
type Result struct {
	Node     string    `json:"node"`
	Passed   bool      `json:"passed"`
	Verdicts []Verdict `json:"verdicts"`
}

// Failed is the verdicts that failed, in the order they were judged.
func (r Result) Failed() []Verdict {
	var out []Verdict
	for _, v := range r.Verdicts {
		if !v.OK {
			out = append(out, v)
		}
	}
	return out
}

// defaultFix is what to do about a failed check when its runner knew no
// better.
var defaultFix = map[Check]string{
	CheckDriver:      "check that nvidia-smi works on this node; reinstall or reload the NVIDIA driver",
	CheckHealth:      "run `gotrain doctor` on this node; drain it for the GPU's repair (ECC/XID) or cooling (throttling)",
	CheckPCIe:        "reseat the GPU or its riser, check the slot's BIOS setting; `nvidia-smi -q -d PCIE` shows the link",
	CheckFramework:   "install a torch built for this driver's CUDA (torch.version.cuda at most the driver's CUDA version) and check CUDA_VISIBLE_DEVICES",
	CheckH2D:         "check the GPU's PCIe link and the NUMA placement; `gotrain doctor` shows both",
	CheckNCCL:        "check NVLink/PCIe with `nvidia-smi topo -m` and `gotrain doctor`; NCCL_DEBUG=INFO names the transport used",
	CheckCPUBusBW:    "the node is slower than the job needs (a CPU quota, a busy or throttled CPU, a slow network): check `top` and the cgroup's cpu.max on this node",
	CheckCPULat:      "the node answers slowly (a CPU quota, an overloaded CPU, a network delay): check `top`, the cgroup's cpu.max and `tc qdisc` on this node",
	CheckGang:        "a node or link of the job is slow: run the job with --preflight full and compare the nodes' figures",
	CheckGangLatency: "a node or link of the job answers slowly: `tc qdisc` and `ping` between the nodes; --verbose logs each node's figures with the leader",
}

// Judge turns a node's figures into verdicts. A numeric figure passes when
// it reaches its Want; a yes/no figure passes unless Failed.
func Judge(node string, figs []Figure) Result {
	res := Result{Node: node, Passed: true, Verdicts: make([]Verdict, 0, len(figs))}
	for _, f := range figs {
		v := Verdict{Node: node, Check: f.Check, Subject: f.Subject, OK: !f.Failed, Measured: f.Detail}
		if f.Unit != "" {
			v.OK = f.Measured >= f.Want
			if f.AtMost {
				v.OK = f.Measured <= f.Want
			}
			bound := ""
			if f.Below {
				bound = "< "
				if f.AtMost {
					bound = "> "
				}
				// Ran out of time: only a bound is known, and the bound
				// is on the wrong side of the threshold when it did not
				// finish, whatever the number says.
				v.OK = false
			}
			v.Measured = bound + number(f.Measured) + " " + f.Unit
			if f.Detail != "" {
				v.Measured += " (" + f.Detail + ")"
			}
			v.Expected = "at least " + number(f.Want) + " " + f.Unit
			if f.AtMost {
				v.Expected = "at most " + number(f.Want) + " " + f.Unit
			}
		}
		if !v.OK {
			v.Fix = f.Fix
			if v.Fix == "" {
				v.Fix = defaultFix[f.Check]
			}
			res.Passed = false
		}
		res.Verdicts = append(res.Verdicts, v)
	}
	return res
}

// number prints a figure with three significant digits, as a person reads
// it: 12.3, 1450, 0.0421.
func number(x float64) string {
	return strconv.FormatFloat(x, 'g', 3, 64)
}

// Scheduler says how the job was started, for the line's way to leave the
// node out.
type Scheduler struct {
	Slurm bool
	// Elastic: --nnodes MIN:MAX, so the job starts without the node.
	// Undecided: this node does not know the job's --nnodes (it joins
	// another node's coordinator without it), so the coordinator decides.
	Elastic, Undecided bool
}

// Line is the one line a person reads about a failed verdict: the node, the
// check, measured against expected, the fix, and what happens to the job.
func Line(v Verdict, s Scheduler) string {
	var b strings.Builder
	fmt.Fprintf(&b, "gotrain: preflight: node %s failed %s", v.Node, v.Check)
	if v.Subject != "" {
		fmt.Fprintf(&b, " on %s", v.Subject)
	}
	fmt.Fprintf(&b, ": measured %s", v.Measured)
	if v.Expected != "" {
		fmt.Fprintf(&b, ", expected %s", v.Expected)
	}
	if v.Fix != "" {
		fmt.Fprintf(&b, "; fix: %s", v.Fix)
	}
	switch {
	case s.Elastic:
		b.WriteString("; the job starts without this node (--nnodes MIN:MAX)")
	case s.Undecided:
		b.WriteString("; the job starts without this node under --nnodes MIN:MAX, and fails before any step otherwise")
	case s.Slurm:
		fmt.Fprintf(&b, "; the job does not start: submit it again with --exclude=%s", v.Node)
	default:
		b.WriteString("; the job does not start: run it without this node, or with --nnodes MIN:MAX to start without it")
	}
	if s.Undecided && s.Slurm {
		fmt.Fprintf(&b, " (srun/sbatch --exclude=%s leaves it out)", v.Node)
	}
	return b.String()
}

// ExitStatus is what gotrain launch exits with when a node failed its
// preflight checks: on that node, and on every node of a job that cannot
// start without it.
const ExitStatus = job.ExitPreflight

// NCCLBusBWFloor is the least bus bandwidth (GB/s) an intra-node NCCL
// all-reduce of a few hundred MiB should reach: far below what a healthy
// node does (NVLink: 300–480 GB/s on H100/H200; PCIe Gen4/5 x16: 10–40),
// so that it fails a node whose links are broken or fell back to a slower
// path (NVLink down, P2P off through the CPU), not one a little slow.
func NCCLBusBWFloor(nvlink bool) float64 {
	if nvlink {
		return 100
	}
	return 5
}
