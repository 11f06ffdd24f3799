package jobenv

import (
	"errors"
	"fmt"
	"strconv"
)

// Variables of a hot standby (gotrain launch --standby): a process of the
// worker program started before any rank needs it. It gets the job-wide
// variables below but no rank; package worker's Init sees Standby, connects
// to the agent and waits until the agent assigns it a rank, then sets the
// variables of Vars.Environ in its own environment and unsets these two.
const (
	Standby     = "GOTRAIN_STANDBY"      // "1" in a standby
	StandbySlot = "GOTRAIN_STANDBY_SLOT" // the local slot (local rank) it waits for

	// StandbyWarmComm is the user's: "0" keeps a standby on the NCCL
	// backend from making its one-rank warm-up communicator
	// (ncclcomm.PrewarmComm), for A/B measurements of it.
	StandbyWarmComm = "GOTRAIN_STANDBY_WARM_COMM"
)

// StandbyVars is what a standby knows before it has a rank.
type StandbyVars struct {
	Slot        int
	AgentSocket string
	JobToken    string
	RunID       string
	Backend     string
	Host        string
	GPU         int // the slot's GPU on the node, -1 for none
}

// Environ returns the standby's variables as KEY=VALUE pairs.
func (v StandbyVars) Environ() []string {
	return []string{
		Standby + "=1",
		StandbySlot + "=" + strconv.Itoa(v.Slot),
		Agent + "=" + v.AgentSocket,
		JobToken + "=" + v.JobToken,
		RunID + "=" + v.RunID,
		Backend + "=" + v.Backend,
		Host + "=" + v.Host,
		GPU + "=" + strconv.Itoa(v.GPU),
		"TORCHELASTIC_RUN_ID=" + v.RunID,
		"NCCL_NVLS_ENABLE=0",
	}
}

// IsStandby reports whether the environment is a standby's.
func IsStandby(getenv func(string) string) bool { return getenv(Standby) == "1" }

// StandbyFromEnv reads a standby's variables through getenv.
func StandbyFromEnv(getenv func(string) string) (StandbyVars, error) {
	if !IsStandby(getenv) {
		return StandbyVars{}, errors.New("jobenv: " + Standby + " is not set")
	}
	v := StandbyVars{AgentSocket: getenv(Agent), JobToken: getenv(JobToken), RunID: getenv(RunID),
		Backend: getenv(Backend), Host: getenv(Host)}
	var errs []error
	for name, dst := range map[string]*int{StandbySlot: &v.Slot, GPU: &v.GPU} {
		n, err := strconv.Atoi(getenv(name))
		if err != nil {
			errs = append(errs, fmt.Errorf("%s=%q is not an integer", name, getenv(name)))
		}
		*dst = n
	}
	if v.AgentSocket == "" {
		errs = append(errs, fmt.Errorf("%s is empty", Agent))
	}
	if len(errs) > 0 {
		return StandbyVars{}, fmt.Errorf("jobenv: bad standby environment from the agent: %w", errors.Join(errs...))
	}
	return v, nil
}
