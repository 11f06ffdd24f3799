package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/gotrain/gotrain/cmd/gotrain/internal/symptoms"
	"github.com/gotrain/gotrain/internal/jobenv"
	"github.com/gotrain/gotrain/internal/jobtls"
	gotrainv1 "github.com/gotrain/gotrain/proto/gotrain/v1"
)

type diagnoseCmd struct{}

func (*diagnoseCmd) name() string { return "diagnose" }
func (*diagnoseCmd) synopsis() string {
	return "say which rank and which collective a running job waits for"
}

const diagnoseUsage = `
Usage: gotrain diagnose [flags]

Asks a running job's coordinator for the hang detector's verdict and prints
it with a table of every rank: its process, its step, and per communicator
the last collective entered and completed and the one it waits in.

Without --coordinator it finds the job that ` + "`gotrain launch`" + ` runs on this
machine: the newest, if several run (it says so, and lists the others), or
the one --run-id names (launch's --run-id, or the id it made, which
` + "`gotrain top`" + ` shows first). Stalls shorter than --hang-timeout are
shown as suspected, classified as the detector would.

Exits 0 when no hang is declared (suspected stalls included), 3 when the
detector has declared a hang in the current generation (a VERDICT: printed,
or in the --json output's status.verdicts), 1 when the coordinator cannot be
asked, 2 on a usage error.

Examples:
  gotrain diagnose
  gotrain diagnose --coordinator 10.0.0.1:29400 --ca-hash sha256:HEX   # GOTRAIN_JOB_TOKEN set
  gotrain diagnose --json | jq .status.verdicts
  gotrain diagnose --run-id gotrain-3f2a9c0b1d2e   # one of several jobs here
`

// exitHang is diagnose's exit status when it reports a hang verdict.
const exitHang = 3

// hangReported is diagnose's error when the job has a hang verdict: the
// output said it; only the status (exitHang) is left.
type hangReported struct{}

func (hangReported) Error() string { return "" }
func (hangReported) ExitCode() int { return exitHang }

// diagnoseTimeout bounds the whole call: diagnose answers within a second on
// a healthy coordinator.
const diagnoseTimeout = 5 * time.Second

func (c *diagnoseCmd) run(ctx context.Context, args []string) error {
	fs := newFlagSet(c.name(), diagnoseUsage)
	addr := fs.String("coordinator", "", "the job's coordinator HOST:PORT (default: the job launched on this machine)")
	runID := fs.String("run-id", "", "the job launched on this machine with this run id (default: the newest)")
	var trust jobtls.Trust
	trustFlags(fs, &trust) // tlsflags.go
	tok := fs.String("job-token", os.Getenv(jobenv.JobToken), "the job token (default $"+jobenv.JobToken+", or the local job's)")
	asJSON := fs.Bool("json", false, "print the DiagnoseResponse as JSON: field names as in the .proto, every field with its zero value too, numbers (int64 too) as JSON numbers, as gotrain top --json")
	stackLines := fs.Int("stack-lines", 40, "lines of each culprit's stacks to print (0: all)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return &usageError{msg: fmt.Sprintf("unexpected argument %q", fs.Arg(0))}
	}
	if *stackLines < 0 {
		return &usageError{msg: fmt.Sprintf("--stack-lines %d", *stackLines), hint: "Give 0 or more (0: all lines)."}
	}
	if err := checkCoordinatorAddrs(*addr); err != nil { // validate.go
		return err
	}
	if err := checkTrust(trust); err != nil {
		return err
	}
	coordAddr, jobToken, trust, err := findJob(c.name(), *addr, *runID, *tok, trust)
	if err != nil {
		return err
	}
	*addr, *tok = coordAddr, jobToken
	ctx, cancel := context.WithTimeout(ctx, diagnoseTimeout)
	defer cancel()
	conn, err := dialJob(*addr, *tok, trust) // findjob.go
	if err != nil {
		return err
	}
	defer conn.Close()
	resp, err := gotrainv1.NewCoordinatorClient(conn).Diagnose(ctx, &gotrainv1.DiagnoseRequest{})
	if err != nil {
		return askFailed(*addr, err) // findjob.go
	}
	if *asJSON {
		if err := writeJSON(os.Stdout, resp, true); err != nil { // jsonout.go
			return err
		}
	} else {
		printDiagnosis(os.Stdout, resp, *stackLines)
	}
	if len(resp.GetStatus().GetVerdicts()) > 0 {
		return hangReported{}
	}
	return nil
}

// printDiagnosis writes the verdicts and the per-rank table.
func printDiagnosis(w io.Writer, d *gotrainv1.DiagnoseResponse, stackLines int) {
	st := d.GetStatus()
	now := time.Unix(0, d.GetNowUnixNanos())
	timeout := (time.Duration(d.GetHangTimeoutMs()) * time.Millisecond).String()
	if d.GetHangTimeoutAdaptive() {
		timeout += " (adaptive: max(3 x p99 interval, 1s))"
	}
	fmt.Fprintf(w, "job %s: %s, generation %d, %d ranks, %d restarts, hang timeout %s\n",
		st.GetRunId(), st.GetState(), st.GetGeneration(), st.GetWorldSize(), st.GetRestartCount(), timeout)
	if f := st.GetFailure(); f != nil && st.GetState() != "running" {
		fmt.Fprintf(w, "last failure: rank %d on %s (pid %d): exit %d %s %s\n", f.GetRank(), f.GetHostname(), f.GetPid(), f.GetExitCode(), f.GetSignal(), f.GetReason())
	}
	for _, v := range st.GetVerdicts() {
		printVerdict(w, "VERDICT", v, now, stackLines)
	}
	for _, v := range d.GetSuspected() {
		printVerdict(w, fmt.Sprintf("SUSPECTED (stalled %s, not yet past the timeout)", now.Sub(time.Unix(0, v.GetLastProgressUnixNanos())).Round(100*time.Millisecond)), v, now, 0)
	}
	if len(st.GetVerdicts()) == 0 && len(d.GetSuspected()) == 0 {
		fmt.Fprintln(w, "no hang: no communicator is stalled with work pending")
	}
	for _, f := range symptoms.Find(symptoms.FromStatus(st)) { // a rank on the CPU, an input-bound job
		fmt.Fprintf(w, "note: %s\n", f.Text)
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "RANK\tHOST\tPID\tGPU\tSTATE\tPROC\tSTEP\tCOMM\tENTERED\tCOMPLETED\tWAITING IN\tREPORTED")
	for _, r := range st.GetRanks() {
		p := r.GetProgress()
		gpu := "-"
		if r.GetGpu() >= 0 {
			gpu = fmt.Sprint(r.GetGpu())
		}
		reported := "never"
		if n := p.GetUnixNanos(); n != 0 {
			reported = now.Sub(time.Unix(0, n)).Round(100*time.Millisecond).String() + " ago"
		} else if p != nil {
			reported = "(not attached)"
		}
		row := func(comm, entered, completed, waiting string) {
			fmt.Fprintf(tw, "%d\t%s\t%d\t%s\t%s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\n", r.GetRank(), r.GetHostname(), p.GetPid(), gpu,
				r.GetState(), dash(p.GetProcessState()), p.GetStep(), comm, entered, completed, waiting, reported)
		}
		if len(p.GetComms()) == 0 {
			row("-", "-", "-", "-")
		}
		for _, c := range p.GetComms() {
			waiting := "-"
			if pc := c.GetPending(); pc != nil {
				waiting = fmt.Sprintf("%s #%d %s %d", pc.GetOp(), pc.GetSeq(), strings.TrimSpace(pc.GetDtype()+" "+pc.GetReduceOp()), pc.GetCount())
				if n := pc.GetEnqueuedUnixNanos(); n != 0 {
					waiting += fmt.Sprintf(" for %s", now.Sub(time.Unix(0, n)).Round(100*time.Millisecond))
				}
				if pc.GetState() == "failed" {
					waiting += " (failed)"
				}
			}
			row(c.GetComm(), fmt.Sprint(c.GetEnteredSeq()), fmt.Sprint(c.GetCompletedSeq()), waiting)
		}
	}
	tw.Flush()
	printViewNotes(w, st.GetRanks())
}

// printVerdict writes one verdict: its summary (as of its detection), then
// the collective it is about, from the verdict itself (not from the ranks'
// latest progress, which may have moved on in other communicators or ranks),
// with how long the stall has lasted now.
func printVerdict(w io.Writer, title string, v *gotrainv1.HangVerdict, now time.Time, stackLines int) {
	fmt.Fprintf(w, "%s [%s] %s\n", title, v.GetKind(), v.GetSummary())
	if line := verdictCollective(v, now); line != "" {
		fmt.Fprintf(w, "  %s\n", line)
	}
	for _, d := range v.GetDetails() {
		fmt.Fprintf(w, "  %s\n", d)
	}
	for _, e := range v.GetEvidence() {
		text := e.GetText()
		if e.GetKind() == "goroutines" {
			text = programStacks(text) // stacks.go: the program's frames first
		}
		lines := strings.Split(strings.TrimRight(text, "\n"), "\n")
		more := 0
		if stackLines > 0 && len(lines) > stackLines {
			lines, more = lines[:stackLines], len(lines)-stackLines
		}
		fmt.Fprintf(w, "  evidence: rank %d (pid %d) %s:\n", e.GetRank(), e.GetPid(), e.GetKind())
		for _, l := range lines {
			fmt.Fprintf(w, "    %s\n", l)
		}
		if more > 0 {
			fmt.Fprintf(w, "    ... %d more lines (--stack-lines 0 shows all)\n", more)
		}
	}
}

// verdictCollective says which collective of which communicator verdict v is
// about, and since when nothing completed there: "collective: allreduce #7
// float32 sum 1024 of comm "grads", stalled 2m3s" ("" for a verdict about no
// collective, a straggler's).
func verdictCollective(v *gotrainv1.HangVerdict, now time.Time) string {
	c := v.GetCollective()
	if c == nil || c.GetSeq() == 0 || v.GetKind() == "straggler" {
		return ""
	}
	op := c.GetOp()
	if op == "" {
		op = "collective"
	}
	line := fmt.Sprintf("collective: %s #%d", op, c.GetSeq())
	if shape := strings.TrimSpace(c.GetDtype() + " " + c.GetReduceOp()); shape != "" {
		line += " " + shape
	}
	if c.GetCount() > 0 {
		line += fmt.Sprintf(" %d", c.GetCount())
	}
	line += fmt.Sprintf(" of comm %q", v.GetComm())
	if n := v.GetLastProgressUnixNanos(); n != 0 {
		line += fmt.Sprintf(", stalled %s", now.Sub(time.Unix(0, n)).Round(100*time.Millisecond))
	}
	if r := v.GetWaiting(); len(r) > 0 {
		line += fmt.Sprintf(", ranks %s waiting in it", joinInts(r))
	}
	return line
}

func joinInts(xs []int32) string {
	s := make([]string, len(xs))
	for i, x := range xs {
		s[i] = fmt.Sprint(x)
	}
	return strings.Join(s, ",")
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// printViewNotes says where the table's collectives of programs that do not
// use the worker library come from, or why there are none.
func printViewNotes(w io.Writer, ranks []*gotrainv1.RankStatus) {
	var ras, hook []string
	for _, r := range ranks {
		p := r.GetProgress()
		switch {
		case p.GetCommsSource() == "torch-hook":
			hook = append(hook, fmt.Sprint(r.GetRank()))
		case p.GetCommsSource() != "":
			ras = append(ras, fmt.Sprint(r.GetRank()))
		case p.GetCommsNote() != "":
			fmt.Fprintf(w, "no collective-level view for rank %d: %s\n", r.GetRank(), p.GetCommsNote())
		}
	}
	if len(ras) > 0 {
		fmt.Fprintf(w, "rank(s) %s: collectives from NCCL RAS (launch counts per function; no dtype or count)\n", strings.Join(ras, ","))
	}
	if len(hook) > 0 {
		fmt.Fprintf(w, "rank(s) %s: collectives from gotrain's PyTorch hook (the gloo default group, by function; no dtype or count)\n", strings.Join(hook, ","))
	}
}
