package main

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"

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

// header is the first 32 bytes of encode's layout: a snapshot is header,
// then Params and Velocity as they lie in memory (little-endian float32 on
// every machine gotrain runs on), which is encode's layout without a copy.
func (s *trainState) header() []byte {
	b := binary.LittleEndian.AppendUint64(nil, uint64(s.Step))
	b = binary.LittleEndian.AppendUint64(b, math.Float64bits(s.Loss))
	b = binary.LittleEndian.AppendUint64(b, math.Float64bits(s.Accuracy))
	return binary.LittleEndian.AppendUint64(b, uint64(len(s.Params)))
}

// restore loads the newest state any rank can find into st on every rank
// (worker.Restore: a snapshot in this rank's agent's memory or a peer's,
// from mem, nil for none; else the newest valid checkpoint of dir), each
// rank saying where it found its own. On a fresh start every rank takes
// rank 0's initial weights. It returns where the state came from ("" for a
// fresh start).
func restore(ctx context.Context, c comm.Comm, mem *worker.Snapshots, dir string, st *trainState, out io.Writer) (string, error) {
	// The state's layout (encode's) as buffers: header, Params, Velocity;
	// the chosen rank broadcasts straight into them.
	hdr := make([]int64, 4)
	tiers := worker.Tiers{Snapshots: mem, Disk: checkpoint.Dir{Path: dir}}
	r, err := worker.Restore(ctx, c, tiers, comm.Host(hdr), comm.Host(st.Params), comm.Host(st.Velocity))
	if r.LocalStep >= 0 {
		fmt.Fprintf(out, "found the state of step %d in %s\n", r.LocalStep, sourceNames[r.LocalSource])
	}
	switch {
	case errors.Is(err, worker.ErrNoState):
		return "", nil // rank 0's initial weights, broadcast
	case err != nil:
		return "", err
	}
	if n := hdr[3]; n != int64(len(st.Params)) {
		return "", fmt.Errorf("the state from %s of rank %d holds %d parameters, the model has %d (another --hidden?)", sourceNames[r.Source], r.Rank, n, len(st.Params))
	}
	st.Step, st.Loss, st.Accuracy = int(hdr[0]), math.Float64frombits(uint64(hdr[1])), math.Float64frombits(uint64(hdr[2]))
	return fmt.Sprintf("%s of rank %d", sourceNames[r.Source], r.Rank), nil
}

// sourceNames say where a state came from, in the found and resumed lines.
var sourceNames = map[string]string{
	worker.FromSurvivor: "a surviving process's memory",
	worker.FromAgent:    "the agent's memory",
	worker.FromPeer:     "a peer agent's memory",
	worker.FromDisk:     "the checkpoint",
}
