package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/gotrain/gotrain/cmd/gotrain/internal/top"
	"github.com/gotrain/gotrain/internal/jobenv"
	"github.com/gotrain/gotrain/internal/jobtls"
	gotrainv1 "github.com/gotrain/gotrain/proto/gotrain/v1"
)

type topCmd struct{}

func (*topCmd) name() string { return "top" }
func (*topCmd) synopsis() string {
	return "watch every rank of a running job: GPU, step rate, last collective"
}

const topUsage = `
Usage: gotrain top [flags]

Shows every rank of a running job, refreshed every second: its host and GPU,
the GPU's utilisation, memory, power and temperature (sampled by the agents
through NVML; "-" without a driver), throttling and XID errors, the CPU the
rank's process uses, the rank's
step and step rate (from worker.ReportStep, or the optimizer steps of a PyTorch
program, counted by gotrain's hook), how long since it last made
progress, and its last collective. The slowest rank comes first: the longest
since progress, then the lowest step rate. Notes above the table name a rank
whose GPU idles while its peers' are busy (it may compute on the CPU) and a
job whose GPUs idle while its ranks keep a CPU busy (input-bound).

Without --coordinator it finds the job that ` + "`gotrain launch`" + ` runs on this
machine: the newest, if several run (it says so, and lists the others), or
the one --run-id names (launch's --run-id, or the id it made, which
` + "`gotrain top`" + ` shows first).

Examples:
  gotrain top
  gotrain top --once --json | jq '.ranks[0]'
  gotrain top --run-id gotrain-3f2a9c0b1d2e   # one of several jobs here
  gotrain top --coordinator 10.0.0.1:29400 --ca-hash sha256:HEX   # GOTRAIN_JOB_TOKEN set
`

// topTimeout bounds one status call.
const topTimeout = 5 * time.Second

// Clear the screen and move the cursor home.
const clearScreen = "\x1b[H\x1b[2J"

func (c *topCmd) run(ctx context.Context, args []string) error {
	fs := newFlagSet(c.name(), topUsage)
	addr := fs.String("coordinator", "", "the job's coordinator HOST:PORT (default: the job launched on this machine)")
	runID := fs.String("run-id", "", "the job launched on this machine with this run id (default: the newest)")
	var trust jobtls.Trust
	trustFlags(fs, &trust) // tlsflags.go
	tok := fs.String("job-token", os.Getenv(jobenv.JobToken), "the job token (default $"+jobenv.JobToken+", or the local job's)")
	once := fs.Bool("once", false, "print once and exit")
	asJSON := fs.Bool("json", false, "print JSON (with --once one document, else one line per refresh); the fields are stable")
	interval := fs.Duration("interval", time.Second, "time between refreshes")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return &usageError{msg: fmt.Sprintf("unexpected argument %q", fs.Arg(0))}
	}
	if *interval <= 0 {
		return &usageError{msg: fmt.Sprintf("--interval %s", *interval), hint: "Give a positive duration, e.g. --interval 2s."}
	}
	if err := checkCoordinatorAddrs(*addr); err != nil { // validate.go
		return err
	}
	if err := checkTrust(trust); err != nil {
		return err
	}
	a, t, trust, err := findJob("top", *addr, *runID, *tok, trust)
	if err != nil {
		return err
	}
	conn, err := dialJob(a, t, trust) // findjob.go
	if err != nil {
		return err
	}
	defer conn.Close()
	client := gotrainv1.NewCoordinatorClient(conn)
	fetch := func(ctx context.Context) (top.Snapshot, error) {
		ctx, cancel := context.WithTimeout(ctx, topTimeout)
		defer cancel()
		st, err := client.GetJobStatus(ctx, &gotrainv1.GetJobStatusRequest{})
		if err != nil {
			return top.Snapshot{}, askFailed(a, err) // findjob.go
		}
		return top.Build(st, time.Now()), nil
	}
	if *once {
		snap, err := fetch(ctx)
		if err != nil {
			return err
		}
		return writeTop(os.Stdout, snap, *asJSON, true)
	}

	ctx, stop := signal.NotifyContext(ctx, syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	tick := time.NewTicker(*interval)
	defer tick.Stop()
	for shown := false; ; shown = true {
		snap, err := fetch(ctx)
		switch {
		case ctx.Err() != nil:
			return nil
		case err != nil && shown && status.Code(errors.Unwrap(err)) == codes.Unavailable:
			// The launcher (and its coordinator) exits when the job ends.
			fmt.Fprintf(os.Stderr, "gotrain top: the coordinator at %s is gone: the job ended\n", a)
			return nil
		case err != nil:
			return err
		}
		var b bytes.Buffer
		if !*asJSON {
			b.WriteString(clearScreen)
		}
		if err := writeTop(&b, snap, *asJSON, false); err != nil {
			return err
		}
		if _, err := os.Stdout.Write(b.Bytes()); err != nil {
			return err
		}
		if snap.State == "succeeded" || snap.State == "failed" {
			return nil
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

// writeTop writes one snapshot: a table, or JSON (indented when indent).
func writeTop(w io.Writer, snap top.Snapshot, asJSON, indent bool) error {
	if !asJSON {
		return snap.WriteTable(w)
	}
	return writeJSON(w, snap, indent) // jsonout.go
}
