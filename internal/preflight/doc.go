// Package preflight is the proof a node gives before its ranks first start,
// or before it replaces a lost node: measured figures in, verdicts out.
//
// The package has two halves. Judge is pure: it takes what the runners
// measured (a Figure per check and subject, with the figure expected) and
// returns a Verdict per figure, naming the node, the check, the measured
// against the expected figure and the fix; Line turns a failed verdict into
// the one line a person reads, with the scheduler's way to leave the node
// out. Thresholds sit far from what healthy nodes measure: preflight
// catches a node that would hold every step back, not one a little slower
// than its peers (stragglers are found while the job runs). The runners measure: CPUGate runs the CPU backend's all-reduce
// (package worker/cpucomm) between ranks of this node over TCP and times
// its bus bandwidth and latency; Framework runs a fixed script of ours in
// the Python interpreter workers will use and reads torch's view of CUDA.
// The GPU checks of `gotrain doctor` are turned into figures by the caller
// (cmd/gotrain), which owns that package.
//
// # Usage
//
//	figs, err := preflight.CPUGate(ctx, preflight.QuickCPU)
//	if err != nil { ... } // the gate could not run: it proves nothing
//	res := preflight.Judge("node2", figs)
//	if !res.Passed {
//		for _, v := range res.Failed() {
//			fmt.Fprintln(os.Stderr, preflight.Line(v, preflight.Scheduler{Slurm: true}))
//		}
//	}
package preflight
