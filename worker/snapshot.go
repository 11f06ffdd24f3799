package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/gotrain/gotrain/internal/memsnap"
)

// In-memory snapshots: after a step, a rank hands its training
// state to its agent, which keeps the newest complete one in memory that
// outlives this process. A restarted rank restores from it (then from a
// peer's copy, then from the disk checkpoint) and loses no step.
//
//	snaps, err := w.Snapshots(ctx)
//	// At start: the newest state any rank finds, the same on every rank.
//	r, err := worker.Restore(ctx, c, worker.Tiers{Snapshots: snaps, Disk: checkpoint.Dir{Path: dir}}, worker.Host(params), worker.Host(velocity))
//	if err == nil { step = r.Step } // ErrNoState: a fresh start
//	for ; step < steps; step++ {
//		train(...)
//		snaps.Save(step+1, worker.Host(params), worker.Host(velocity)) // copies, returns; the hand-over overlaps the next step
//	}

// Sources of a restored state.
const (
	FromAgent = memsnap.SourceOwn  // this node's agent's memory
	FromPeer  = memsnap.SourcePeer // a peer node's agent's memory
	FromDisk  = "disk"             // the disk checkpoint
)

// ErrNoState is Restore's answer when no rank found a state in any tier
// (and Latest's when this rank's agent holds none): the run starts fresh.
var ErrNoState = errors.New("worker: no snapshot in memory and no checkpoint on disk")

// Snapshots is this rank's handle on its agent's in-memory snapshot tier.
// Save and Restore are meant for the training goroutine; Wait and Stats
// may be called from any goroutine.
type Snapshots struct {
	rank int
	log  *slog.Logger
	c    *memsnap.Client

	mu sync.Mutex
	// Two buffers, written in turn: the agent serves the one of index held
	// (-1: neither), the next Save writes the other. Reusing them keeps a
	// snapshot's copy at memory speed: a fresh page's first write costs a
	// fault (on a VM, 10-20x the copy).
	bufs     [2]*memsnap.Buffer
	locked   [2]bool // page-locked for device copies (snapshot_device.go)
	held     int
	inflight chan struct{} // closed when the hand-over in flight ends; nil: none
	err      error         // the last hand-over's
	stats    SnapshotStats
}

// SnapshotStats counts what Save did.
type SnapshotStats struct {
	Saved   int           // snapshots the agent kept
	Skipped int           // Saves skipped because the previous hand-over was still in flight
	Failed  int           // hand-overs the agent refused or that failed
	Step    int64         // of the newest snapshot the agent kept
	Bytes   int64         // its size
	Copy    time.Duration // the last Save's copy (the part on the training step's path)
	Handed  time.Duration // the last hand-over, in the background: checksum, agent's check
}

// Snapshots connects to this rank's agent's snapshot tier. It fails when
// the agent offers none (an older gotrain, or a platform without memfd):
// the program then goes on with its disk checkpoints.
func (w *Worker) Snapshots(ctx context.Context) (*Snapshots, error) {
	if w.vars.AgentSocket == "" {
		return nil, fmt.Errorf("worker: rank %d: no agent, so no in-memory snapshots", w.Rank)
	}
	dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	c, err := memsnap.Dial(dctx, memsnap.SocketFor(w.vars.AgentSocket), w.vars.JobToken, w.Rank)
	if err != nil {
		return nil, fmt.Errorf("worker: %w", err)
	}
	log := w.logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Snapshots{rank: w.Rank, log: log.With("rank", w.Rank), c: c, held: -1}, nil
}

// Save snapshots state (buffers in host or device memory, concatenated) as
// the state after step. It copies the buffers into shared memory before it
// returns, so the program may change them at once, and hands the copy to
// the agent in the background, overlapping the next step. When the
// previous hand-over is still in flight, Save skips this step and returns
// false: training never waits for the tier, and the agent keeps serving the
// previous snapshot.
//
// Device buffers are copied on the calling thread, whose current CUDA
// context must hold them (as for every other call on them); the caller
// makes sure the step's work on them is done (synchronizes the streams that
// write them) before Save. The shared memory is page-locked once, at the
// first device copy into it, so the copies run at the link's rate.
func (s *Snapshots) Save(step int64, state ...Buffer) bool {
	return s.save(step, partsOf(state))
}

// SaveBytes is Save for byte slices.
func (s *Snapshots) SaveBytes(step int64, parts ...[]byte) bool {
	state := make([]statePart, len(parts))
	for i, p := range parts {
		state[i] = statePart{host: p, n: len(p)}
	}
	return s.save(step, state)
}

func (s *Snapshots) save(step int64, state []statePart) bool {
	var size int64
	for _, p := range state {
		size += int64(p.n)
	}
	s.mu.Lock()
	if s.inflight != nil {
		s.stats.Skipped++
		s.mu.Unlock()
		return false
	}
	idx := 0
	if s.held == 0 {
		idx = 1
	}
	buf := s.bufs[idx]
	s.mu.Unlock()
	start := time.Now()
	if buf != nil && buf.Size() != size {
		s.discard(idx)
		buf = nil
	}
	if buf == nil {
		var err error
		if buf, err = memsnap.NewBuffer(size); err != nil {
			s.fail(fmt.Errorf("worker: rank %d: shared memory for the snapshot of step %d: %w", s.rank, step, err))
			return false
		}
	}
	if err := s.copyIn(idx, buf, state); err != nil {
		s.fail(fmt.Errorf("worker: rank %d: the snapshot of step %d: %w", s.rank, step, err))
		s.mu.Lock()
		s.bufs[idx] = buf
		s.mu.Unlock()
		return false
	}
	copied := time.Since(start)
	done := make(chan struct{})
	s.mu.Lock()
	s.bufs[idx] = buf
	s.inflight = done
	s.stats.Copy = copied
	s.mu.Unlock()
	go s.handOver(idx, buf, step, size, done)
	return true
}

// handOver commits bufs[idx]; after the first, it also prepares the other
// buffer (its pages written once), so that no Save pays for fresh pages.
func (s *Snapshots) handOver(idx int, buf *memsnap.Buffer, step, size int64, done chan struct{}) {
	start := time.Now()
	err := s.c.CommitReused(buf, step)
	handed := time.Since(start)
	s.mu.Lock()
	other := s.bufs[1-idx]
	s.mu.Unlock()
	// One of another size is replaced by the next Save, on its thread: it
	// may be page-locked, which only that thread's context can undo.
	if err == nil && other == nil {
		if other, _ = memsnap.NewBuffer(size); other != nil { // a failure only costs the next Save an allocation
			clear(other.Bytes())
		}
	}
	s.mu.Lock()
	s.inflight = nil
	s.err = err
	s.stats.Handed = handed
	if err == nil {
		s.stats.Saved++
		s.stats.Step, s.stats.Bytes = step, size
		s.held = idx
		s.bufs[1-idx] = other
	} else {
		s.stats.Failed++
	}
	first := err != nil && s.stats.Failed == 1
	s.mu.Unlock()
	close(done)
	if first {
		s.log.Warn("the agent did not keep this rank's snapshot; training goes on, a restart will resume from an older state", "step", step, "err", err)
	}
}

func (s *Snapshots) fail(err error) {
	s.mu.Lock()
	s.err = err
	s.stats.Failed++
	first := s.stats.Failed == 1
	s.mu.Unlock()
	if first {
		s.log.Warn("no in-memory snapshot", "err", err)
	}
}

// Wait waits for the hand-over in flight, if any, and returns the last
// hand-over's error.
func (s *Snapshots) Wait(ctx context.Context) error {
	s.mu.Lock()
	ch := s.inflight
	s.mu.Unlock()
	if ch != nil {
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

// Stats returns what Save did so far.
func (s *Snapshots) Stats() SnapshotStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stats
}

// Close waits for the hand-over in flight and ends the connection; the
// agent keeps what it was given.
func (s *Snapshots) Close() error {
	_ = s.Wait(context.Background())
	err := s.c.Close()
	for i := range s.bufs {
		s.discard(i) // the agent keeps its own reference to the one it serves
	}
	return err
}

// State is a restored training state.
type State struct {
	Step   int64  // the step the state is after
	Source string // FromAgent, FromPeer or FromDisk
	data   []byte
	mem    *memsnap.Restored
}

// Bytes returns the state as saved (read-only; valid until Close).
func (st *State) Bytes() []byte { return st.data }

// Into copies the state into bufs (host or device memory), which must be
// the sizes Save was given. Device buffers are written on the calling
// thread, as in Save.
func (st *State) Into(bufs ...Buffer) error {
	var want int
	for _, b := range bufs {
		want += b.Bytes()
	}
	if want != len(st.data) {
		return fmt.Errorf("worker: the state of step %d (from %s) holds %d bytes, the buffers %d (another model size?)", st.Step, st.Source, len(st.data), want)
	}
	return copyOut(st.data, partsOf(bufs))
}

// Close frees the state's memory.
func (st *State) Close() {
	if st.mem != nil {
		st.mem.Close()
		st.mem = nil
	}
	st.data = nil
}
