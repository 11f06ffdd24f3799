// Package flight is the worker's flight recorder: for every communicator, a
// ring buffer of the last collectives it issued (seq, op, dtype, count,
// root or peer, stream, state and times), and a summary of where the
// communicator stands (last entered, last completed, the oldest pending
// collective, the last error, the total time spent waiting in collectives).
// The worker reports the summary to its agent about once a second; the job's
// coordinator compares the ranks' summaries to tell which rank and which
// collective a hung job waits for.
//
// # Usage
//
// Package worker wraps every communicator it builds:
//
//	rec := flight.NewRecorder("grads", flight.DefaultSize)
//	c = flight.Wrap(backend, rec)
//
// Recording costs one uncontended mutex and two clock reads per collective
// and allocates nothing.
//
// Synchronous backends (the CPU backend, NCCL's blocking calls) are covered
// by the wrapper alone: a collective is entered when the call is made and
// completed when it returns. A backend whose collectives complete after the
// call returns (work enqueued on a CUDA stream) implements [Tracker]: the
// wrapper then records only the entry, and the backend marks the collective
// started and completed as it sees it happen, for instance from a goroutine
// that polls CUDA events.
package flight

import (
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/gotrain/gotrain/worker/comm"
)

// DefaultSize is how many collectives a recorder keeps.
const DefaultSize = 2000

// Op is the kind of a collective.
type Op uint8

const (
	OpAllReduce Op = iota + 1
	OpBroadcast
	OpAllGather
	OpReduceScatter
	OpBarrier
	OpSend
	OpRecv
)

var opNames = [...]string{
	OpAllReduce: "allreduce", OpBroadcast: "broadcast", OpAllGather: "allgather",
	OpReduceScatter: "reducescatter", OpBarrier: "barrier", OpSend: "send", OpRecv: "recv",
}

func (o Op) String() string {
	if int(o) < len(opNames) && opNames[o] != "" {
		return opNames[o]
	}
	return fmt.Sprintf("Op(%d)", uint8(o))
}

// reduces reports whether the op takes a reduction.
func (o Op) reduces() bool { return o == OpAllReduce || o == OpReduceScatter }

// State is where a collective is.
type State uint8

const (
	Enqueued  State = iota + 1 // the call was made (async backends: the work is queued)
	Started                    // the work began (async backends report it)
	Completed                  // done
	Failed                     // the call or the work failed
)

var stateNames = [...]string{Enqueued: "enqueued", Started: "started", Completed: "completed", Failed: "failed"}

func (s State) String() string {
	if int(s) < len(stateNames) && stateNames[s] != "" {
		return stateNames[s]
	}
	return fmt.Sprintf("State(%d)", uint8(s))
}

// Entry is one collective.
type Entry struct {
	Seq   uint64 // 1 for the communicator's first collective
	Op    Op
	DType comm.DType
	// Reduce is the reduction of all-reduce and reduce-scatter.
	Reduce comm.Op
	// Count is the element count (per rank for all-gather and reduce-scatter).
	Count int64
	// Peer is the broadcast root or the point-to-point peer, -1 for none.
	Peer int32
	// Stream is the CUDA stream the work was enqueued on, 0 for none.
	Stream uintptr
	State  State
	// Unix nanoseconds; 0 when not reached.
	Enqueued, Started, Completed int64
}

// ReduceName is the reduction's name, "" for ops without one.
func (e Entry) ReduceName() string {
	if !e.Op.reduces() {
		return ""
	}
	return e.Reduce.String()
}

func (e Entry) String() string {
	s := fmt.Sprintf("#%d %s %s count=%d", e.Seq, e.Op, e.DType, e.Count)
	if r := e.ReduceName(); r != "" {
		s += " op=" + r
	}
	if e.Peer >= 0 {
		s += fmt.Sprintf(" peer=%d", e.Peer)
	}
	return s + " " + e.State.String()
}

// Recorder records one communicator's collectives. It is safe for concurrent
// use: the communicator's goroutine records while the reporter reads.
type Recorder struct {
	name string

	mu          sync.Mutex
	ring        []Entry
	issued      uint64 // seq of the last collective entered
	completed   uint64 // every collective up to this seq completed
	completedAt int64  // when completed completed, unix nanos
	wait        int64  // total nanos completed collectives took
	errSeq      uint64
	err         string
	version     uint64 // bumped on every change
	notify      func() // called after a failure, outside mu
}

// NewRecorder returns a recorder for communicator name that keeps the last
// size collectives (DefaultSize when size < 1).
func NewRecorder(name string, size int) *Recorder {
	if size < 1 {
		size = DefaultSize
	}
	return &Recorder{name: name, ring: make([]Entry, size)}
}

// Name is the communicator's name.
func (r *Recorder) Name() string { return r.name }

// OnFailure sets a function called (on the recording goroutine) after a
// collective failed, so that a reporter can send the failure at once.
func (r *Recorder) OnFailure(f func()) {
	r.mu.Lock()
	r.notify = f
	r.mu.Unlock()
}

func now() int64 { return time.Now().UnixNano() }

// Enqueue records that a collective was issued and returns its seq. With
// started set the work is taken to begin at once (synchronous backends).
func (r *Recorder) Enqueue(op Op, dt comm.DType, reduce comm.Op, count int64, peer int, stream uintptr, started bool) uint64 {
	t := now()
	r.mu.Lock()
	r.issued++
	seq := r.issued
	e := &r.ring[(seq-1)%uint64(len(r.ring))]
	*e = Entry{Seq: seq, Op: op, DType: dt, Reduce: reduce, Count: count, Peer: int32(peer), Stream: stream, State: Enqueued, Enqueued: t}
	if started {
		e.State, e.Started = Started, t
	}
	r.version++
	r.mu.Unlock()
	return seq
}

// Issued returns the seq of the last collective entered; inside a backend
// call made through [Wrap], the seq of that call.
func (r *Recorder) Issued() uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.issued
}

// entry returns seq's entry if the ring still holds it. r.mu is held.
func (r *Recorder) entry(seq uint64) *Entry {
	if seq == 0 || seq > r.issued {
		return nil
	}
	e := &r.ring[(seq-1)%uint64(len(r.ring))]
	if e.Seq != seq {
		return nil
	}
	return e
}

// Start records that seq's work began.
func (r *Recorder) Start(seq uint64) {
	t := now()
	r.mu.Lock()
	if e := r.entry(seq); e != nil && e.State == Enqueued {
		e.State, e.Started = Started, t
		r.version++
	}
	r.mu.Unlock()
}

// Complete records that seq finished. Completions may arrive out of order;
// the completed seq advances over every finished collective in a row.
func (r *Recorder) Complete(seq uint64) {
	t := now()
	r.mu.Lock()
	if e := r.entry(seq); e != nil && e.State != Completed {
		if e.Started == 0 {
			e.Started = t
		}
		e.State, e.Completed = Completed, t
		r.wait += t - e.Enqueued
	}
	for {
		e := r.entry(r.completed + 1)
		if e == nil || e.State != Completed {
			break
		}
		r.completed++
		r.completedAt = e.Completed
	}
	r.version++
	r.mu.Unlock()
}

// Fail records that seq failed with err.
func (r *Recorder) Fail(seq uint64, err error) {
	msg := "failed"
	if err != nil {
		msg = err.Error()
	}
	t := now()
	r.mu.Lock()
	if e := r.entry(seq); e != nil {
		e.State, e.Completed = Failed, t
	}
	r.errSeq, r.err = seq, msg
	r.version++
	notify := r.notify
	r.mu.Unlock()
	if notify != nil {
		notify()
	}
}

// Snapshot is where a communicator stands.
type Snapshot struct {
	Comm      string
	Entered   uint64 // seq of the last collective entered
	Completed uint64 // every collective up to this seq completed
	// CompletedAt is when Completed completed (unix nanos), 0 before the first.
	CompletedAt int64
	// Last is the last collective entered; Pending the oldest not completed.
	Last, Pending Entry
	HasPending    bool
	// Wait is the total time completed collectives took.
	Wait time.Duration
	// Err ended collective ErrSeq; empty if none failed.
	Err    string
	ErrSeq uint64
	// Version changes whenever the recorder records something.
	Version uint64
	// RecentWaits are how long the latest completed collectives (up to
	// RecentCount, those the ring still holds) took from entry to
	// completion, seqs RecentFirst, RecentFirst+1, ...: the coordinator's
	// straggler check compares them across ranks (the one that waits least
	// arrived last).
	RecentFirst uint64
	RecentWaits []time.Duration
}

// RecentCount is how many per-collective waits a Snapshot carries at most.
const RecentCount = 16

// Snapshot returns the communicator's summary.
func (r *Recorder) Snapshot() Snapshot {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := Snapshot{
		Comm: r.name, Entered: r.issued, Completed: r.completed, CompletedAt: r.completedAt,
		Wait: time.Duration(r.wait), Err: r.err, ErrSeq: r.errSeq, Version: r.version,
	}
	if e := r.entry(r.issued); e != nil {
		s.Last = *e
	}
	first := uint64(1)
	if r.completed > RecentCount {
		first = r.completed - RecentCount + 1
	}
	for seq := first; seq <= r.completed; seq++ {
		e := r.entry(seq)
		if e == nil || e.State != Completed {
			s.RecentWaits = s.RecentWaits[:0] // keep them contiguous
			continue
		}
		if len(s.RecentWaits) == 0 {
			s.RecentFirst = seq
		}
		s.RecentWaits = append(s.RecentWaits, time.Duration(e.Completed-e.Enqueued))
	}
	if r.issued > r.completed {
		if e := r.entry(r.completed + 1); e != nil {
			s.Pending, s.HasPending = *e, true
		}
	}
	return s
}

// Entries returns the collectives the ring holds, oldest first.
func (r *Recorder) Entries() []Entry {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := min(r.issued, uint64(len(r.ring)))
	out := make([]Entry, 0, n)
	for seq := r.issued - n + 1; seq <= r.issued && n > 0; seq++ {
		if e := r.entry(seq); e != nil {
			out = append(out, *e)
		}
	}
	return out
}

// Dump writes the last n collectives (all with n < 1) as text, oldest first.
func (r *Recorder) Dump(w io.Writer, n int) error {
	es := r.Entries()
	if n > 0 && len(es) > n {
		es = es[len(es)-n:]
	}
	if _, err := fmt.Fprintf(w, "flight recorder of comm %q: %d collectives\n", r.name, len(es)); err != nil {
		return err
	}
	for _, e := range es {
		line := e.String()
		if e.Enqueued != 0 {
			line += " entered=" + time.Unix(0, e.Enqueued).UTC().Format("15:04:05.000000")
		}
		if e.Completed != 0 {
			line += fmt.Sprintf(" took=%s", time.Duration(e.Completed-e.Enqueued))
		}
		if _, err := fmt.Fprintln(w, line); err != nil {
			return err
		}
	}
	return nil
}
