package job

import "fmt"

// ExitPreflight is what every launcher of a job exits with when a node
// failed its preflight checks and the job could not start without it.
const ExitPreflight = 4

// failPreflight ends the job before its first step: node n failed its
// preflight checks. An elastic job's agent leaves such a node out by not
// joining, so a node that joins with a failure is one the job cannot do
// without: a job of a fixed size, or the node that runs its coordinator.
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
