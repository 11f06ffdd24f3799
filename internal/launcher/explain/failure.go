package explain

import (
	"fmt"
	"strings"

	"github.com/gotrain/gotrain/internal/launcher/observe"
	gotrainv1 "github.com/gotrain/gotrain/proto/gotrain/v1"
)

// DescribeFailure writes the report a person reads when the job failed.
func DescribeFailure(f *gotrainv1.JobFinished) string {
	var b strings.Builder
	fl := f.GetFailure()
	if fl == nil {
		fmt.Fprintf(&b, "gotrain: job failed: %s", f.GetMessage())
		return b.String()
	}
	if fl.GetReason() != "" && fl.GetNodeId() != "" && fl.GetSignal() == "" && len(fl.GetStderrTail()) == 0 {
		// The whole node went away (the machine's NodeLost), not one worker.
		fmt.Fprintf(&b, "gotrain: job failed: node %s on %s (agent pid %d) was lost: %s", fl.GetNodeId(), fl.GetHostname(), fl.GetPid(), fl.GetReason())
		if m := f.GetMessage(); m != "" {
			fmt.Fprintf(&b, "\n  %s", m)
		}
		return b.String()
	}
	cause := fmt.Sprintf("exit status %d", fl.GetExitCode())
	if fl.GetSignal() != "" {
		cause = "killed by " + fl.GetSignal()
	}
	if fl.GetReason() != "" {
		cause = fl.GetReason()
	}
	switch {
	case cudaOOM(fl): // restartline.go
		fmt.Fprintf(&b, "gotrain: job failed: rank %d on %s (pid %d) ran out of GPU memory (%s)", fl.GetRank(), fl.GetHostname(), fl.GetPid(), cause)
	case fl.GetPid() == 0:
		fmt.Fprintf(&b, "gotrain: job failed: rank %d on %s could not be started: %s", fl.GetRank(), fl.GetHostname(), errorLine(fl.GetStderrTail(), true))
	default:
		fmt.Fprintf(&b, "gotrain: job failed: rank %d on %s (pid %d) failed first: %s", fl.GetRank(), fl.GetHostname(), fl.GetPid(), cause)
	}
	if m := f.GetMessage(); m != "" {
		fmt.Fprintf(&b, "\n  %s", m)
	}
	observe.WriteEvidence(&b, fl)
	if cudaOOM(fl) {
		fmt.Fprintf(&b, "\n  %s", observe.OOMFixes)
	}
	if tl := fl.GetStderrTail(); len(tl) > 0 {
		fmt.Fprintf(&b, "\n  last %d line(s) of rank %d's stderr:", len(tl), fl.GetRank())
		for _, l := range tl {
			fmt.Fprintf(&b, "\n    %s", l)
		}
	}
	return b.String()
}

// FormatVerdictLog is what the agent prints when the detector fires.
func FormatVerdictLog(v *gotrainv1.HangVerdict) string {
	var b strings.Builder
	what := "hang detected"
	if v.GetKind() == "straggler" {
		what = "straggler"
	}
	fmt.Fprintf(&b, "gotrain: %s (%s, generation %d): %s\n", what, v.GetKind(), v.GetGeneration(), v.GetSummary())
	for _, d := range v.GetDetails() {
		fmt.Fprintf(&b, "gotrain:   %s\n", d)
	}
	if v.GetKind() != "straggler" {
		b.WriteString("gotrain:   run `gotrain diagnose` for every rank and the culprits' stacks\n")
	}
	return b.String()
}
