package worker

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/gotrain/gotrain/internal/memsnap"
	"github.com/gotrain/gotrain/worker/checkpoint"
)

// FromSurvivor is the Source of a state a rank held in its own memory
// because its process outlived the previous generation (inside Run).
const FromSurvivor = "survivor"

// sources numbers the Sources for the agreement's all-reduce.
var sources = []string{FromSurvivor, FromAgent, FromPeer, FromDisk}

// Tiers are where one rank looks for its state before the ranks agree.
type Tiers struct {
	// Snapshots is this rank's handle on its agent's in-memory tier; nil
	// when the program keeps no snapshots.
	Snapshots *Snapshots
	// Disk holds the checkpoints; the zero Dir: none.
	Disk checkpoint.Dir
	// Held says that the buffers given to Restore already hold this
	// process's live state after HeldStep: a survivor inside Run
	// (Generation.Survivor). Such a rank does not look in the other tiers.
	Held     bool
	HeldStep int64
}

// Restored says which state Restore put in the buffers, and what this rank
// had found itself before the ranks agreed.
type Restored struct {
	Step   int64  // the step the state is after
	Source string // FromSurvivor, FromAgent, FromPeer or FromDisk
	Rank   int    // the rank whose tier it came from
	// LocalStep and LocalSource are what this rank found in its own tiers
	// (LocalStep -1 and LocalSource "": nothing), for a program's log.
	LocalStep   int64
	LocalSource string
}

// Restore puts the newest state any rank can find into bufs on every rank:
// each rank looks in its own tiers (its live state when Held, else its
// agent's memory, a peer agent's copy, then the disk checkpoint), the ranks
// agree on the newest step found and the lowest rank holding it, and that
// rank broadcasts it. After Restore every rank's bufs are equal. bufs are
// the buffers Save was given (host or device memory, the sizes the state
// was saved with); the checkpoint on disk must have that layout too.
//
// Restore is collective: every rank of c calls it, with buffers of the same
// shapes. When no rank found a state it returns ErrNoState on every rank,
// with rank 0's bufs broadcast, so that a fresh start begins alike
// everywhere. A rank whose tier fails (a disk read error, a state of
// another size) makes Restore fail on every rank, naming that rank.
func Restore(ctx context.Context, c Comm, from Tiers, bufs ...Buffer) (Restored, error) {
	rank, size := c.Rank(), c.Size()
	res := Restored{Rank: -1, LocalStep: -1}
	localErr := from.findInto(bufs, &res)

	// The newest step found, and the highest rank that failed (0: none).
	agree := []int64{res.LocalStep, 0}
	if localErr != nil {
		agree[0], agree[1] = -1, int64(rank+1)
	}
	if err := c.AllReduce(ctx, Host(agree), Host(agree), Max); err != nil {
		return res, fmt.Errorf("worker: rank %d: restore: agree on the newest state: %w", rank, err)
	}
	switch {
	case localErr != nil:
		return res, fmt.Errorf("worker: rank %d: restore: %w", rank, localErr)
	case agree[1] > 0:
		return res, fmt.Errorf("worker: rank %d: restore: rank %d could not read its state (its error says why); no rank resumes", rank, agree[1]-1)
	}
	newest := agree[0]

	// The lowest rank holding it, with its source, in one number.
	pick := []int64{int64(size * len(sources))}
	if newest >= 0 && res.LocalStep == newest {
		pick[0] = int64(rank*len(sources) + slices.Index(sources, res.LocalSource))
	}
	if err := c.AllReduce(ctx, Host(pick), Host(pick), Min); err != nil {
		return res, fmt.Errorf("worker: rank %d: restore: agree on the rank to restore from: %w", rank, err)
	}
	root := 0 // a fresh start: rank 0's initial state
	if newest >= 0 {
		root = int(pick[0]) / len(sources)
		res.Step, res.Source, res.Rank = newest, sources[int(pick[0])%len(sources)], root
	}
	for _, b := range bufs {
		if err := c.Broadcast(ctx, b, root); err != nil {
			return res, fmt.Errorf("worker: rank %d: restore: receive the state from rank %d: %w", rank, root, err)
		}
	}
	if newest < 0 {
		return res, ErrNoState
	}
	return res, nil
}

// findInto looks for this rank's own newest state and copies it into bufs,
// recording what it found in res. Copying before the agreement means a
// rank that later finds it cannot copy (and so cannot send) has already
// said so, instead of leaving the others waiting in the broadcast.
func (from Tiers) findInto(bufs []Buffer, res *Restored) error {
	if from.Held {
		res.LocalStep, res.LocalSource = from.HeldStep, FromSurvivor
		return nil
	}
	st, err := from.local()
	switch {
	case errors.Is(err, ErrNoState):
		return nil
	case err != nil:
		return err
	}
	defer st.Close()
	if !slices.Contains(sources, st.Source) {
		return fmt.Errorf("a state of step %d from an unknown source %q", st.Step, st.Source)
	}
	want := 0
	for _, b := range bufs {
		want += b.Bytes()
	}
	if len(st.data) != want {
		where := st.Source
		if st.Source == FromDisk {
			where = from.Disk.Path
		}
		return fmt.Errorf("the state of step %d in %s holds %d bytes, the buffers %d: a state of another model size; restore with the buffers it was saved from, or move it aside to start fresh", st.Step, where, len(st.data), want)
	}
	if err := copyOut(st.data, partsOf(bufs)); err != nil {
		return fmt.Errorf("copy the state of step %d from %s into the buffers: %w", st.Step, st.Source, err)
	}
	res.LocalStep, res.LocalSource = st.Step, st.Source
	return nil
}

// local returns this rank's newest state from its agent's memory (its own
// or a peer's copy), else the disk; ErrNoState when neither holds one. A
// snapshot that fails its length or checksum check is never returned: the
// log says so and the disk is tried.
func (from Tiers) local() (*State, error) {
	if s := from.Snapshots; s != nil {
		st, err := s.Latest()
		switch {
		case err == nil:
			return st, nil
		case !errors.Is(err, ErrNoState):
			s.log.Warn("the in-memory snapshot cannot be used; trying the disk checkpoint", "err", err)
		}
	}
	if from.Disk.Path == "" {
		return nil, ErrNoState
	}
	step, b, err := from.Disk.Latest()
	switch {
	case errors.Is(err, checkpoint.ErrNone):
		return nil, ErrNoState
	case err != nil:
		return nil, fmt.Errorf("read the disk checkpoint in %s: %w", from.Disk.Path, err)
	}
	return &State{Step: step, Source: FromDisk, data: b}, nil
}

// Latest returns this rank's newest snapshot in memory: the one its agent
// keeps, else a peer node's copy; ErrNoState when neither holds one. It
// looks at no other rank and no disk: Restore is the restore a training
// program wants at start.
func (s *Snapshots) Latest() (*State, error) {
	r, err := s.c.Latest()
	switch {
	case errors.Is(err, memsnap.ErrNone):
		return nil, ErrNoState
	case err != nil:
		return nil, fmt.Errorf("worker: rank %d: the in-memory snapshot: %w", s.rank, err)
	}
	return &State{Step: r.Step, Source: r.Source, data: r.Bytes(), mem: r}, nil
}
