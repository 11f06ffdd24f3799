package state

import (
	"cmp"
	"fmt"
	"strings"
	"time"

	"github.com/gotrain/gotrain/internal/coordinator/job"
)

// settingsError lists every contradicting setting; its message is what the
// person at the joining node reads.
type settingsError struct{ problems []string }

func (e *settingsError) Error() string        { return strings.Join(e.problems, "; ") }
func (e *settingsError) Is(target error) bool { return target == ErrSettingsMismatch }

// CheckSettings compares the job-wide settings a joining agent was given
// explicitly with the job's (jc).
//
// A setting that changes WHAT the job does is an error, because the person
// who gave it expects a job that will not run: --nnodes (the job's size: a
// different number means another job, or a batch size and learning rate
// planned for another world size), --max-restarts (whether and how often the
// job survives a failure), --on-hang (whether a hang ends the generation
// or only reports it) and --on-straggler (whether a persistent straggler is
// replaced). A setting that changes only WHEN something happens is a
// warning, and the job's value applies: --restart-backoff, --hang-timeout,
// --straggler-persist and --rendezvous-timeout (the rendezvous is already
// under way when a node joins). --run-id is a warning too: the agent already takes the job's, so
// its workers see one run id.
func CheckSettings(jc job.Config, given Settings) (warnings []string, err error) {
	if !given.Given {
		return nil, nil // an agent of before JobSettings, or one given none
	}
	var problems []string
	differs := func(flag string, ours, theirs any) string {
		return fmt.Sprintf("--%s %v on this node, but the job was started with --%s %v", flag, ours, flag, theirs)
	}
	fail := func(flag string, ours, theirs any) {
		problems = append(problems, differs(flag, ours, theirs)+": drop the flag on joining nodes or give the same value")
	}
	warn := func(flag string, ours, theirs any) {
		warnings = append(warnings, differs(flag, ours, theirs)+": the job's value applies (drop the flag on joining nodes or give the same value)")
	}
	if given.Nodes != nil {
		min := *given.Nodes
		if given.MinNodes != nil {
			min = *given.MinNodes
		}
		jmin := cmp.Or(jc.MinNodes, jc.Nodes)
		if *given.Nodes != jc.Nodes || min != jmin {
			fail("nnodes", nnodes(min, *given.Nodes), nnodes(jmin, jc.Nodes))
		}
	}
	if given.MaxRestarts != nil && *given.MaxRestarts != jc.MaxRestarts {
		fail("max-restarts", *given.MaxRestarts, jc.MaxRestarts)
	}
	if given.OnHang != nil && *given.OnHang != jc.OnHang {
		fail("on-hang", *given.OnHang, jc.OnHang)
	}
	if given.OnStraggler != nil && *given.OnStraggler != cmp.Or(jc.OnStraggler, job.OnStragglerReport) {
		fail("on-straggler", *given.OnStraggler, cmp.Or(jc.OnStraggler, job.OnStragglerReport))
	}
	if d := given.RestartBackoff; d != nil && *d != jc.RestartBackoff.Truncate(time.Millisecond) {
		warn("restart-backoff", *d, jc.RestartBackoff)
	}
	if d := given.HangTimeout; d != nil && *d != jc.HangTimeout.Truncate(time.Millisecond) {
		warn("hang-timeout", *d, jc.HangTimeout)
	}
	if d := given.StragglerPersist; d != nil && *d != cmp.Or(jc.StragglerPersist, job.DefaultStragglerPersist).Truncate(time.Millisecond) {
		warn("straggler-persist", *d, cmp.Or(jc.StragglerPersist, job.DefaultStragglerPersist))
	}
	if d := given.RendezvousTimeout; d != nil && *d != jc.RendezvousTimeout.Truncate(time.Millisecond) {
		warn("rendezvous-timeout", *d, jc.RendezvousTimeout)
	}
	if given.RunID != nil && *given.RunID != jc.RunID {
		warn("run-id", *given.RunID, jc.RunID)
	}
	if problems != nil {
		return warnings, &settingsError{problems: problems}
	}
	return warnings, nil
}

// nnodes writes --nnodes as the user does: N, or MIN:MAX.
func nnodes(min, max int) string {
	if min == max {
		return fmt.Sprint(max)
	}
	return fmt.Sprintf("%d:%d", min, max)
}
