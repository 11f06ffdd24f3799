package main

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"

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
	b := binary.LittleEndian.AppendUint64(nil, uint64(s.Step))
	b = binary.LittleEndian.AppendUint64(b, math.Float64bits(s.Loss))
	b = binary.LittleEndian.AppendUint64(b, math.Float64bits(s.Accuracy))
	b = binary.LittleEndian.AppendUint64(b, uint64(len(s.Params)))
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

// restore loads the newest valid checkpoint of dir into st on every rank,
// then makes rank 0's view everyone's with broadcasts, so that the ranks
// resume identically even if they saw different files. It reports whether
// rank 0 resumed.
func restore(ctx context.Context, c comm.Comm, dir string, st *trainState) (bool, error) {
	resumed := false
	if dir != "" {
		_, b, err := checkpoint.Dir{Path: dir}.Latest()
		switch {
		case errors.Is(err, checkpoint.ErrNone):
		case err != nil:
			return false, err
		default:
			if err := st.decode(b); err != nil {
				return false, err
			}
			resumed = true
		}
	}
	meta := []float64{float64(st.Step), st.Loss, st.Accuracy, 0}
	if resumed {
		meta[3] = 1
	}
	for _, buf := range []comm.Buffer{comm.Host(meta), comm.Host(st.Params), comm.Host(st.Velocity)} {
		if err := c.Broadcast(ctx, buf, 0); err != nil {
			return false, fmt.Errorf("broadcast the starting state: %w", err)
		}
	}
	st.Step, st.Loss, st.Accuracy = int(meta[0]), meta[1], meta[2]
	return meta[3] == 1, nil
}
