package agentcore

import "time"

// Do carries out one action and returns the events it caused (a spawn's
// Spawned or SpawnFailed, a measure's MemoryMeasured, ...), which Drive
// feeds back to the machine before the next action. depth is how many such
// feedbacks deep the action is (0: an action of the event Drive was given),
// for transcripts that indent them.
type Do func(depth int, act Action) []Event

// Drive is the one loop around the machine: it steps m with ev at now,
// carries out each action through do and feeds the events an action caused
// back at once (depth first, in order), until the actions run out or one is
// a Finish, which it returns after do has seen it (nil: none came). The
// shell (package launcher) and the transcript harness both drive the
// machine through it, so they cannot differ in how actions and their
// events interleave.
func Drive(m *Machine, now func() time.Time, ev Event, do Do) (*Finish, error) {
	return drive(m, now, ev, do, 0)
}

func drive(m *Machine, now func() time.Time, ev Event, do Do, depth int) (*Finish, error) {
	acts, err := m.Step(now(), ev)
	if err != nil {
		return nil, err
	}
	for _, act := range acts {
		next := do(depth, act)
		if f, ok := act.(Finish); ok {
			return &f, nil
		}
		for _, e := range next {
			if f, err := drive(m, now, e, do, depth+1); f != nil || err != nil {
				return f, err
			}
		}
	}
	return nil, nil
}
