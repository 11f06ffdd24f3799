package coordinator

import (
	"cmp"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/gotrain/gotrain/coordinator/job"
	gotrainv1 "github.com/gotrain/gotrain/proto/gotrain/v1"
)

// ErrSettingsMismatch is returned (wrapped) by checkSettings when a joining
// agent was given a job-wide setting that contradicts the job's. Join answers
// it with FailedPrecondition.
var ErrSettingsMismatch = errors.New("coordinator: job settings differ")

// settingsError lists every contradicting setting; its message is what the
// person at the joining node reads.
type settingsError struct{ problems []string }

func (e *settingsError) Error() string        { return strings.Join(e.problems, "; ") }
func (e *settingsError) Is(target error) bool { return target == ErrSettingsMismatch }

// checkSettings compares the job-wide settings a joining agent was given
// explicitly (given; absent fields were not given) with the job's. It is
// pure: the job's values in, a verdict out.
//
// A setting that changes WHAT the job does is an error, because the person
// who gave it expects a job that will not run: --nnodes (the job's size: a
// different number means another job, or a batch size and learning rate
// planned for another world size), --max-restarts (whether and how often the
// job survives a failure) and --on-hang (whether a hang ends the generation
// or only reports it). A setting that changes only WHEN something happens is
// a warning, and the job's value applies: --restart-backoff, --hang-timeout
// and --rendezvous-timeout (the rendezvous is already under way when a node
// joins). --run-id is a warning too: the agent already takes the job's, so
// its workers see one run id.
func checkSettings(jc job.Config, given *gotrainv1.JobSettings) (warnings []string, err error) {
	if given == nil {
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
	ms := func(v int64) time.Duration { return time.Duration(v) * time.Millisecond }

	if given.Nodes != nil {
		min := int(given.GetMinNodes())
		if given.MinNodes == nil {
			min = int(given.GetNodes())
		}
		jmin := cmp.Or(jc.MinNodes, jc.Nodes)
		if int(given.GetNodes()) != jc.Nodes || min != jmin {
			fail("nnodes", nnodes(min, int(given.GetNodes())), nnodes(jmin, jc.Nodes))
		}
	}
	if given.MaxRestarts != nil && int(given.GetMaxRestarts()) != jc.MaxRestarts {
		fail("max-restarts", given.GetMaxRestarts(), jc.MaxRestarts)
	}
	if given.OnHang != nil && given.GetOnHang() != jc.OnHang {
		fail("on-hang", given.GetOnHang(), jc.OnHang)
	}
	if given.RestartBackoffMs != nil && ms(given.GetRestartBackoffMs()) != jc.RestartBackoff.Truncate(time.Millisecond) {
		warn("restart-backoff", ms(given.GetRestartBackoffMs()), jc.RestartBackoff)
	}
	if given.HangTimeoutMs != nil && ms(given.GetHangTimeoutMs()) != jc.HangTimeout.Truncate(time.Millisecond) {
		warn("hang-timeout", ms(given.GetHangTimeoutMs()), jc.HangTimeout)
	}
	if given.RendezvousTimeoutMs != nil && ms(given.GetRendezvousTimeoutMs()) != jc.RendezvousTimeout.Truncate(time.Millisecond) {
		warn("rendezvous-timeout", ms(given.GetRendezvousTimeoutMs()), jc.RendezvousTimeout)
	}
	if given.RunId != nil && given.GetRunId() != jc.RunID {
		warn("run-id", given.GetRunId(), jc.RunID)
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
