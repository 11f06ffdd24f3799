package launcher

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"google.golang.org/grpc/status"

	"github.com/gotrain/gotrain/internal/coordinator/job"
	"github.com/gotrain/gotrain/internal/launcher/pystandby"
	"github.com/gotrain/gotrain/internal/nodehealth"
	"github.com/gotrain/gotrain/internal/preflight"
)

// Preflight is how this node proves itself before it joins the job
// (package internal/preflight): cmd/gotrain builds the runners, which need
// the GPU and doctor packages the launcher does not import.
type Preflight struct {
	// Level is --preflight's (never Off: then Config.Preflight is nil).
	Level preflight.Level
	// Run measures the node. python is the workers' interpreter for a
	// Python program ("" otherwise), env their base environment.
	Run func(ctx context.Context, python string, env []string) ([]preflight.Figure, error)
	// Ledger keeps this machine's verdicts; nil: none kept.
	Ledger *nodehealth.Ledger
	// Policy keeps a repeat offender out of elastic jobs.
	Policy nodehealth.Policy
	// Slurm: the failure line names srun's --exclude.
	Slurm bool
	// Now is the clock (default time.Now).
	Now func() time.Time
}

// preflightProgressEvery is how often a preflight that takes long says it
// still runs.
var preflightProgressEvery = 5 * time.Second

// elastic: the job starts without a node that fails, as long as this node
// is not the one that runs its coordinator.
func (a *agent) elastic() bool {
	return a.cfg.MinNodes > 0 && a.cfg.MinNodes < a.cfg.Nodes && a.cfg.Coordinator != ""
}

// undecided: this node joins another's coordinator without knowing the
// job's --nnodes; the coordinator decides whether the job goes on without
// it (job.ErrPreflightFailed) or fails.
func (a *agent) undecided() bool {
	return a.cfg.Coordinator != "" && !a.elastic() && a.cfg.Nodes <= 1
}

// preflightRefused turns the coordinator's refusal of a failed node, or of
// a machine in its cool-off, into the preflight exit status; other errors
// are returned as they are.
func (a *agent) preflightRefused(err error) error {
	var jr *joinRefused
	if !errors.As(err, &jr) {
		return err
	}
	failed := a.preflightFailure != "" && strings.Contains(jr.Error(), job.ErrPreflightFailed.Error())
	// The coordinator's ledger keeps this machine out of an elastic job
	// for a while (internal/coordinator/state/health.go): a node's verdict too.
	cooling := strings.Contains(jr.Error(), job.ErrCoolingOff.Error())
	if failed || cooling {
		msg := strings.TrimPrefix(status.Convert(jr.err).Message(), "job: ")
		return &ExitError{Code: preflight.ExitStatus, Message: fmt.Sprintf("gotrain: %s (exit status %d)", msg, preflight.ExitStatus)}
	}
	return err
}

// preflight proves this node before it joins. It returns the failure to
// send with the Join (the job cannot start without this node: the Join
// fails it), "" when the node passed, or an *ExitError when this node stays
// out of an elastic job (it failed, or the ledger keeps it out).
func (a *agent) preflight(ctx context.Context) (string, error) {
	p := a.cfg.Preflight
	if p == nil {
		return "", nil
	}
	now := time.Now
	if p.Now != nil {
		now = p.Now
	}
	if p.Ledger != nil && a.elastic() {
		recs, _, err := p.Ledger.Read()
		if err != nil {
			fmt.Fprintf(a.cfg.Stderr, "gotrain: warning: %v; this machine's health record is not used\n", err)
		}
		if d := nodehealth.Decide(recs, a.host, now(), p.Policy); !d.Admit {
			return "", &ExitError{Code: preflight.ExitStatus, Message: d.Line}
		}
	}
	a.setPhase(ctx, fmt.Sprintf("preflight (%s): checking this node before it joins", p.Level))
	start := now()
	stop := a.sayPreflight(ctx, p.Level, start)
	python := ""
	if pystandby.IsPython(a.cfg.Program) {
		python = a.cfg.Program
	}
	figs, err := p.Run(ctx, python, a.cfg.Env)
	stop()
	if ctx.Err() != nil {
		return "", ctx.Err()
	}
	if err != nil {
		// A check that could not run proves nothing either way: the node
		// goes on, and says so.
		fmt.Fprintf(a.cfg.Stderr, "gotrain: warning: preflight on %s could not run: %v\n", a.host, err)
		return "", nil
	}
	res := preflight.Judge(a.host, figs)
	took := now().Sub(start)
	if res.Passed {
		a.log.Info("preflight passed", "level", p.Level, "took", took, "checks", len(res.Verdicts))
		fmt.Fprintf(a.cfg.Stderr, "gotrain: preflight (%s) passed on %s in %.1f s: %s\n", p.Level, a.host, took.Seconds(), summary(res))
		return "", nil
	}
	sched := preflight.Scheduler{Slurm: p.Slurm, Elastic: a.elastic(), Undecided: a.undecided()}
	var lines []string
	for _, v := range res.Failed() {
		line := preflight.Line(v, sched)
		fmt.Fprintln(a.cfg.Stderr, line)
		lines = append(lines, strings.TrimPrefix(line, "gotrain: preflight: "))
		if p.Ledger != nil {
			detail := strings.TrimSpace(v.Subject + " " + v.Measured)
			if v.Expected != "" {
				detail += " (expected " + v.Expected + ")"
			}
			rec := nodehealth.Record{Time: now(), Host: a.host, Kind: nodehealth.Preflight, Check: string(v.Check), Detail: detail, RunID: a.cfg.RunID}
			if err := p.Ledger.Append(rec); err != nil {
				fmt.Fprintf(a.cfg.Stderr, "gotrain: warning: the verdict is not kept in this machine's health record: %v\n", err)
			}
		}
	}
	if a.elastic() {
		return "", &ExitError{Code: preflight.ExitStatus, Message: fmt.Sprintf("gotrain: this node (%s) failed preflight and stays out of the job (--nnodes %s); exit status %d", a.host, a.nnodes(), preflight.ExitStatus)}
	}
	return cutText(strings.Join(lines, " | "), maxPreflightFailure), nil
}

// maxPreflightFailure bounds the failure a Join carries: the coordinator
// refuses more (internal/coordinator/state's maxPreflightText).
const maxPreflightFailure = 8000

// cutText cuts s to at most n bytes at a rune boundary, saying so.
func cutText(s string, n int) string {
	const more = " …(cut)"
	if len(s) <= n {
		return s
	}
	i := n - len(more)
	for i > 0 && !utf8.RuneStart(s[i]) {
		i--
	}
	return s[:i] + more
}

// summary is the passed checks' figures, for the one line that says the
// node passed.
func summary(res preflight.Result) string {
	var parts []string
	for _, v := range res.Verdicts {
		if v.Expected != "" { // a figure, not a yes/no finding
			parts = append(parts, fmt.Sprintf("%s %s", v.Check, strings.SplitN(v.Measured, " (", 2)[0]))
		}
	}
	if len(parts) == 0 {
		return fmt.Sprintf("%d checks", len(res.Verdicts))
	}
	return strings.Join(parts, ", ")
}

// sayPreflight says every preflightProgressEvery that the preflight still
// runs, until stop is called.
func (a *agent) sayPreflight(ctx context.Context, level preflight.Level, start time.Time) (stop func()) {
	return sayEvery(ctx, preflightProgressEvery, func() {
		fmt.Fprintf(a.cfg.Stderr, "gotrain: preflight (%s) on %s: still checking (%s so far)\n", level, a.host, time.Since(start).Round(time.Second))
	})
}

// recordVerdict keeps what ended this node's part of a job in the
// machine's health record: lost from the job, dropped as a straggler.
func (a *agent) recordVerdict(kind nodehealth.Kind, detail string) {
	a.appendVerdict(kind, "", detail)
}

// appendVerdict keeps a verdict of check against this machine.
func (a *agent) appendVerdict(kind nodehealth.Kind, check, detail string) {
	p := a.cfg.Preflight
	if p == nil || p.Ledger == nil {
		return
	}
	rec := nodehealth.Record{Time: time.Now(), Host: a.host, Kind: kind, Check: check, Detail: detail, RunID: a.cfg.RunID}
	if err := p.Ledger.Append(rec); err != nil {
		a.log.Warn("node-health record", "err", err)
	}
}
