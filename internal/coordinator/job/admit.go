package job

import "fmt"

// Admit says whether Step would take ev now: nil, or the error Step would
// return. It changes nothing. A replicated coordinator's leader asks it
// before it puts a request into the log, so that refused requests leave
// nothing in the log of every replica; Step checks again (the state may
// have changed in between), with the same code.
func (m *Machine) Admit(ev Event) error {
	switch ev := ev.(type) {
	case NodeJoined:
		return m.checkJoin(ev)
	case WorkerExited:
		return m.checkExit(ev)
	case WorkerParked:
		return m.checkParked(ev)
	case BarrierArrived:
		return m.checkArrive(ev)
	case ProgressReported:
		return m.checkProgress(ev)
	case NodeLost:
		return m.checkKnown(ev.NodeID, "lost")
	case NodeUnreachable:
		return m.checkKnown(ev.NodeID, "unreachable")
	case NodeReachable:
		return m.checkKnown(ev.NodeID, "reachable")
	case BarrierCanceled, Tick, EvidenceReported:
		return nil
	}
	return fmt.Errorf("%w: unknown event type %T", ErrInvalidEvent, ev)
}

func (m *Machine) checkKnown(id, what string) error {
	if m.nodes[id] == nil {
		return fmt.Errorf("%w %q %s", ErrUnknownNode, id, what)
	}
	return nil
}
