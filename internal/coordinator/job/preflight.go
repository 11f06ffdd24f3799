package job

import (
	"errors"
	"fmt"
)

// ExitPreflight is what every launcher of a job exits with when a node
// failed its preflight checks and the job could not start without it.
const ExitPreflight = 4

// checkPreflight refuses the join of a node that failed its preflight
// checks when the job can do without it: under --nnodes MIN:MAX, unless it
// is the node that runs the coordinator. Its agent then exits with
// ExitPreflight and the job starts (or goes on) without it.
func (m *Machine) checkPreflight(ev NodeJoined) error {
	if ev.Info.PreflightFailure == "" || m.cfg.MinNodes >= m.cfg.Nodes || ev.Host {
		return nil
	}
	return fmt.Errorf("%w: node %s stays out; the job (--nnodes %s) goes on without it", ErrPreflightFailed, ev.Info.Hostname, m.nnodes())
}

// failPreflight ends the job before its first step: node n failed its
// preflight checks, and the job cannot do without it (checkPreflight let
// it join): a job of a fixed size, or the node that runs its coordinator.
func (m *Machine) failPreflight(n *node) []Action {
	m.state = StateFailed
	m.pendingRestart = false
	acts := m.failBarriers("a node failed its preflight checks")
	return append(acts, FinishJob{
		ExitCode: ExitPreflight,
		Message: fmt.Sprintf("node %s (%s) failed its preflight checks, before any step; the job does not start without it (--nnodes %s): %s",
			n.info.Hostname, n.info.Address, m.nnodes(), n.info.PreflightFailure),
	})
}

// ErrCoolingOff: a machine that failed twice within the node-health
// policy's window tried to join an elastic job during its cool-off.
var ErrCoolingOff = errors.New("job: machine is cooling off")
