package main

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"

	"github.com/gotrain/gotrain/worker"
	"github.com/gotrain/gotrain/worker/checkpoint"
	"github.com/gotrain/gotrain/worker/comm"
)

// trainState is what a checkpoint holds: enough to continue the run exactly.
// The shuffles need no state: each epoch's order is drawn from (seed, epoch),
// and a resumed epoch skips the steps it already took.
type trainState struct {
	Step     int     // global steps taken
	Loss     float64 // the last finished epoch's loss and accuracy
	Accuracy float64
	Params   []float32
	Velocity []float32
}

func (s *trainState) encode() []byte {
	b := s.header()
	for _, xs := range [][]float32{s.Params, s.Velocity} {
		for _, x := range xs {
			b = binary.LittleEndian.AppendUint32(b, math.Float32bits(x))
		}
	}
	return b
}

// decode fills s, whose Params and Velocity have the model's size, from b.
func (s *trainState) decode(b []byte) error {
	if len(b) < 32 {
		return errors.New("checkpoint state is too short")
	}
	n := binary.LittleEndian.Uint64(b[24:])
	if n != uint64(len(s.Params)) || uint64(len(b)) != 32+8*n {
		return fmt.Errorf("checkpoint holds %d parameters, the model has %d (another --hidden?)", n, len(s.Params))
	}
	s.Step = int(binary.LittleEndian.Uint64(b))
	s.Loss = math.Float64frombits(binary.LittleEndian.Uint64(b[8:]))
	s.Accuracy = math.Float64frombits(binary.LittleEndian.Uint64(b[16:]))
	b = b[32:]
	for _, xs := range [][]float32{s.Params, s.Velocity} {
		for i := range xs {
			xs[i] = math.Float32frombits(binary.LittleEndian.Uint32(b))
			b = b[4:]
		}
	}
	return nil
}

// header is the first 32 bytes of encode's layout: a snapshot is header,
// then Params and Velocity as they lie in memory (little-endian float32 on
// every machine gotrain runs on), which is encode's layout without a copy.
func (s *trainState) header() []byte {
	b := binary.LittleEndian.AppendUint64(nil, uint64(s.Step))
	b = binary.LittleEndian.AppendUint64(b, math.Float64bits(s.Loss))
	b = binary.LittleEndian.AppendUint64(b, math.Float64bits(s.Accuracy))
	return binary.LittleEndian.AppendUint64(b, uint64(len(s.Params)))
}

// stateTier is the in-memory snapshot tier (worker.Snapshots).
type stateTier interface {
	SaveBytes(step int64, parts ...[]byte) bool
	Restore(disk checkpoint.Dir) (*worker.State, error)
	Wait(ctx context.Context) error
}

// restore loads the newest state into st on every rank: from mem (this
// rank's snapshot in its agent's memory, or a peer's; nil: none) or else
// the newest valid checkpoint of dir. Data-parallel ranks hold the same
// state at the same step, so the rank with the newest one (the lowest such
// rank) broadcasts it to everyone, and the ranks resume identically even if
// they found different states. It returns where the state came from ("" for
// a fresh start).
func restore(ctx context.Context, c comm.Comm, mem stateTier, dir string, st *trainState, out io.Writer) (string, error) {
	source, have := "", int64(-1)
	var found []byte
	var state *worker.State
	var err error
	if mem != nil {
		state, err = mem.Restore(checkpoint.Dir{Path: dir})
	} else {
		state, err = (*worker.Snapshots)(nil).Restore(checkpoint.Dir{Path: dir})
	}
	switch {
	case errors.Is(err, worker.ErrNoState):
	case err != nil:
		return "", err
	default:
		defer state.Close()
		found, source = state.Bytes(), state.Source
	}
	if found != nil {
		if err := st.decode(found); err != nil {
			return "", fmt.Errorf("the state from %s: %w", source, err)
		}
		have = int64(st.Step)
		// Each rank says where it found its own (the broadcast below may
		// replace it with a newer one).
		fmt.Fprintf(out, "found the state of step %d in %s\n", have, sourceNames[slices.Index(sources, source)])
	}
	// The newest step any rank found, then the lowest rank that has it.
	agree := []int64{have}
	if err := c.AllReduce(ctx, comm.Host(agree), comm.Host(agree), comm.Max); err != nil {
		return "", fmt.Errorf("agree on the newest state: %w", err)
	}
	newest := agree[0]
	root := []int64{int64(c.Size())}
	if have == newest {
		root[0] = int64(c.Rank())
	}
	if err := c.AllReduce(ctx, comm.Host(root), comm.Host(root), comm.Min); err != nil {
		return "", fmt.Errorf("agree on the newest state: %w", err)
	}
	if newest < 0 {
		root[0], source = 0, "" // a fresh start: rank 0's initial weights
	}
	meta := []float64{float64(st.Step), st.Loss, st.Accuracy, float64(slices.Index(sources, source))}
	for _, buf := range []comm.Buffer{comm.Host(meta), comm.Host(st.Params), comm.Host(st.Velocity)} {
		if err := c.Broadcast(ctx, buf, int(root[0])); err != nil {
			return "", fmt.Errorf("broadcast the starting state: %w", err)
		}
	}
	st.Step, st.Loss, st.Accuracy = int(meta[0]), meta[1], meta[2]
	if newest < 0 {
		return "", nil
	}
	return fmt.Sprintf("%s of rank %d", sourceNames[int(meta[3])], root[0]), nil
}

// sources are where a state can come from, in the order restore's
// broadcast numbers them; sourceNames say them in the resumed line.
var (
	sources     = []string{worker.FromAgent, worker.FromPeer, worker.FromDisk}
	sourceNames = []string{"the agent's memory", "a peer agent's memory", "the checkpoint"}
)
