package coordinator

import (
	"github.com/gotrain/gotrain/internal/coordinator/job"
	"github.com/gotrain/gotrain/internal/coordinator/logentry"
	"github.com/gotrain/gotrain/internal/coordinator/state"
	gotrainv1 "github.com/gotrain/gotrain/proto/gotrain/v1"
)

// ErrSettingsMismatch is returned (wrapped) by checkSettings when a joining
// agent was given a job-wide setting that contradicts the job's. Join answers
// it with FailedPrecondition.
var ErrSettingsMismatch = state.ErrSettingsMismatch

// checkSettings compares the job-wide settings a joining agent was given
// explicitly (given; absent fields were not given) with the job's: see
// state.CheckSettings.
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
func checkSettings(jc job.Config, given *gotrainv1.JobSettings) (warnings []string, err error) {
	return state.CheckSettings(jc, logentry.Settings(given)) // the one check, in the replicated state
}
