package coordinator

import (
	"math/rand/v2"

	"github.com/gotrain/gotrain/internal/coordinator/state"
)

// waiters are the Barrier calls waiting on this replica for their answer
// (a state.Answer effect), by waiter id. Guarded by Server.mu.
type waiters struct {
	seq uint64
	m   map[uint64]chan error
}

// newWaiters starts the ids at random: they are unique across replicas,
// since a leader's are in the replicated barrier state and the next
// leader's must not clash.
func newWaiters() waiters {
	return waiters{seq: rand.Uint64() &^ (1<<32 - 1), m: map[uint64]chan error{}}
}

// add registers a new waiter: its id, and where its answer comes.
func (w *waiters) add() (uint64, <-chan error) {
	w.seq++
	ch := make(chan error, 1)
	w.m[w.seq] = ch
	return w.seq, ch
}

// answer ends waiter id's wait with err (nil: the barrier passed); an id
// not waiting here (another replica's, or gone) is ignored.
func (w *waiters) answer(id uint64, err error) {
	if ch, ok := w.m[id]; ok {
		ch <- err // buffered: never blocks
		delete(w.m, id)
	}
}

// drop forgets waiter id, whose call ended.
func (w *waiters) drop(id uint64) { delete(w.m, id) }

// streamTable is each present node's watch stream transport (outbox), by
// node id. Guarded by Server.mu.
type streamTable map[string]*outbox

// of is node id's outbox, made on first use; nil when the state has no
// outbox for it (the node is unknown, or lost).
func (t streamTable) of(st *state.State, id string) *outbox {
	if st.Outbox(id) == nil {
		return nil
	}
	o := t[id]
	if o == nil {
		o = newOutbox()
		// A node that has not attached yet is out of contact: its first
		// stream is its attach, which the machine hears (reach.go).
		o.unreachable = !st.Machine().Attached(id)
		t[id] = o
	}
	return o
}
