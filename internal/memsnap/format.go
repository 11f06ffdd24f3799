package memsnap

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
)

// The Python workers' snapshot format (python/gotrain/_format.py): a magic,
// a header length, a JSON header naming the rank, the step and where each
// tensor's raw bytes lie, then the bytes. The agent checks the facts it can
// (the rank and step it is told, every tensor inside the file) before it
// keeps such a snapshot, so that one claiming another rank or step is
// refused where it is handed over; restores check it again in full.

// FormatPython names the format in a put (request.Format).
const FormatPython = "gtsnap1"

var pythonMagic = []byte("GTSNAP1\n")

// maxPythonHeader bounds the header the agent reads (as the module does).
const maxPythonHeader = 64 << 20

type pythonHeader struct {
	Rank    *int   `json:"rank"`
	Step    *int64 `json:"step"`
	Size    int64  `json:"size"`
	Tensors []struct {
		Offset int64 `json:"offset"`
		Nbytes int64 `json:"nbytes"`
	} `json:"tensors"`
}

// checkPythonSnapshot says why data is not a snapshot of rank at step in
// the Python format, or nil.
func checkPythonSnapshot(data []byte, rank int, step int64) error {
	if len(data) < 16 || string(data[:8]) != string(pythonMagic) {
		return fmt.Errorf("rank %d's snapshot of step %d is not in the format it names (%s)", rank, step, FormatPython)
	}
	n := binary.LittleEndian.Uint64(data[8:16])
	if n > maxPythonHeader || n > uint64(len(data)-16) {
		return fmt.Errorf("rank %d's snapshot of step %d names a header of %d bytes in %d", rank, step, n, len(data))
	}
	var h pythonHeader
	if err := json.Unmarshal(data[16:16+n], &h); err != nil {
		return fmt.Errorf("rank %d's snapshot of step %d: its header: %v", rank, step, err)
	}
	switch {
	case h.Rank == nil || *h.Rank != rank:
		return fmt.Errorf("a snapshot handed over as rank %d's says it is of rank %v", rank, deref(h.Rank))
	case h.Step == nil || *h.Step != step:
		return fmt.Errorf("rank %d's snapshot handed over as step %d says it is of step %v", rank, step, deref(h.Step))
	case h.Size != int64(len(data)):
		return fmt.Errorf("rank %d's snapshot of step %d says it holds %d bytes, it holds %d", rank, step, h.Size, len(data))
	}
	for i, t := range h.Tensors {
		if t.Offset < 16+int64(n) || t.Nbytes < 0 || t.Offset > int64(len(data))-t.Nbytes {
			return fmt.Errorf("rank %d's snapshot of step %d: tensor %d lies outside the file", rank, step, i)
		}
	}
	return nil
}

func deref[T any](p *T) any {
	if p == nil {
		return "nothing"
	}
	return *p
}
