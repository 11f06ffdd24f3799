package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/gotrain/gotrain/internal/jobenv"
	"github.com/gotrain/gotrain/internal/token"
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
machine (the newest, if several run). Stalls shorter than --hang-timeout are
shown as suspected, classified as the detector would.

Examples:
  gotrain diagnose
  gotrain diagnose --coordinator 10.0.0.1:29400 --job-token $GOTRAIN_JOB_TOKEN
  gotrain diagnose --json | jq .status.verdicts
`

// diagnoseTimeout bounds the whole call: diagnose answers within a second on
// a healthy coordinator.
const diagnoseTimeout = 5 * time.Second

func (c *diagnoseCmd) run(ctx context.Context, args []string) error {
	fs := newFlagSet(c.name(), diagnoseUsage)
	addr := fs.String("coordinator", "", "the job's coordinator HOST:PORT (default: the job launched on this machine)")
	tok := fs.String("job-token", os.Getenv(jobenv.JobToken), "the job token (default $"+jobenv.JobToken+", or the local job's)")
	asJSON := fs.Bool("json", false, "print the DiagnoseResponse as JSON (proto3 JSON mapping, field names as in the .proto)")
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
	if err := checkHostPort("--coordinator", *addr, true); err != nil {
		return err
	}
	coordAddr, jobToken, err := findJob(c.name(), *addr, *tok)
	if err != nil {
		return err
	}
	*addr, *tok = coordAddr, jobToken
	ctx, cancel := context.WithTimeout(ctx, diagnoseTimeout)
	defer cancel()
	conn, err := grpc.NewClient(*addr, grpc.WithTransportCredentials(insecure.NewCredentials()), token.DialOption(*tok))
	if err != nil {
		return fmt.Errorf("coordinator address %q: %w", *addr, err)
	}
	defer conn.Close()
	resp, err := gotrainv1.NewCoordinatorClient(conn).Diagnose(ctx, &gotrainv1.DiagnoseRequest{})
	if err != nil {
		return fmt.Errorf("ask the coordinator at %s: %w (is the job still running? is the token right?)", *addr, err)
	}
	if *asJSON {
		b, err := protojson.MarshalOptions{UseProtoNames: true}.Marshal(resp)
		if err != nil {
			return err
		}
		var out bytes.Buffer
		if err := json.Indent(&out, b, "", "  "); err != nil {
			return err
		}
		out.WriteByte('\n')
		_, err = os.Stdout.Write(out.Bytes())
		return err
	}
	printDiagnosis(os.Stdout, resp, *stackLines)
	return nil
}

// printDiagnosis writes the verdicts and the per-rank table.
func printDiagnosis(w io.Writer, d *gotrainv1.DiagnoseResponse, stackLines int) {
	st := d.GetStatus()
	now := time.Unix(0, d.GetNowUnixNanos())
	fmt.Fprintf(w, "job %s: %s, generation %d, %d ranks, %d restarts, hang timeout %s\n",
		st.GetRunId(), st.GetState(), st.GetGeneration(), st.GetWorldSize(), st.GetRestartCount(), time.Duration(d.GetHangTimeoutMs())*time.Millisecond)
	if f := st.GetFailure(); f != nil && st.GetState() != "running" {
		fmt.Fprintf(w, "last failure: rank %d on %s (pid %d): exit %d %s %s\n", f.GetRank(), f.GetHostname(), f.GetPid(), f.GetExitCode(), f.GetSignal(), f.GetReason())
	}
	for _, v := range st.GetVerdicts() {
		printVerdict(w, "VERDICT", v, stackLines)
	}
	for _, v := range d.GetSuspected() {
		printVerdict(w, fmt.Sprintf("SUSPECTED (stalled %s, not yet past the timeout)", now.Sub(time.Unix(0, v.GetLastProgressUnixNanos())).Round(100*time.Millisecond)), v, 0)
	}
	if len(st.GetVerdicts()) == 0 && len(d.GetSuspected()) == 0 {
		fmt.Fprintln(w, "no hang: no communicator is stalled with work pending")
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

func printVerdict(w io.Writer, title string, v *gotrainv1.HangVerdict, stackLines int) {
	fmt.Fprintf(w, "%s [%s] %s\n", title, v.GetKind(), v.GetSummary())
	for _, d := range v.GetDetails() {
		fmt.Fprintf(w, "  %s\n", d)
	}
	for _, e := range v.GetEvidence() {
		lines := strings.Split(strings.TrimRight(e.GetText(), "\n"), "\n")
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

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// printViewNotes says where the table's collectives of programs that do not
// use the worker library come from, or why there are none.
func printViewNotes(w io.Writer, ranks []*gotrainv1.RankStatus) {
	var ras []string
	for _, r := range ranks {
		p := r.GetProgress()
		switch {
		case p.GetCommsSource() != "":
			ras = append(ras, fmt.Sprint(r.GetRank()))
		case p.GetCommsNote() != "":
			fmt.Fprintf(w, "no collective-level view for rank %d: %s\n", r.GetRank(), p.GetCommsNote())
		}
	}
	if len(ras) > 0 {
		fmt.Fprintf(w, "rank(s) %s: collectives from NCCL RAS (launch counts per function; no dtype or count)\n", strings.Join(ras, ","))
	}
}
