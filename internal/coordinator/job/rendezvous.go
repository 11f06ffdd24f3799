package job

import (
	"fmt"
	"strings"
)

// The rendezvous: a job waits in StateWaiting until Config.Nodes nodes have
// joined. With a RendezvousTimeout, the wait is bounded: the first Tick at or
// after it fails the job, so that agents waiting for a node that never comes
// (a wrong address or token on the other node, a node that never started)
// end with a message instead of waiting forever.

// rendezvousTick fails a job whose nodes did not all join in time; nil when
// the rendezvous is not over or not bounded.
func (m *Machine) rendezvousTick() []Action {
	d, ok := m.Deadline()
	if m.state != StateWaiting || !ok || m.now.Before(d) {
		return nil
	}
	joined := make([]string, 0, len(m.nodes))
	for _, n := range m.orderedNodes() {
		joined = append(joined, fmt.Sprintf("%s on %s at %s", n.id, n.info.Hostname, n.info.Address))
	}
	who := "none joined"
	if len(joined) > 0 {
		who = "joined: " + strings.Join(joined, ", ")
	}
	m.state = StateFailed
	return []Action{FinishJob{
		ExitCode: 1,
		Message: fmt.Sprintf("the job never started: %d of %d nodes joined within the rendezvous timeout of %s (%s); "+
			"start the missing nodes with the command the first node printed, check their --coordinator address and job token, or raise --rendezvous-timeout",
			len(m.nodes), m.cfg.Nodes, m.cfg.RendezvousTimeout, who),
	}}
}
