// Package torchhook gives the agent a collective-level view of PyTorch
// programs on gloo, which have neither the worker library's flight
// recorder nor NCCL's RAS service: without it, a rank
// that stops calling collectives in a CPU job is judged only by its
// process state.
//
// The view comes from a sitecustomize module (sitecustomize.py, embedded
// here) that the agent puts on its workers' PYTHONPATH. The program is not
// changed: the module counts the collectives of the gloo default process
// group (torch.distributed calls and DistributedDataParallel's gradient
// buckets) into a 256-byte memory-mapped record per process, which [Read]
// decodes. The agent maps a record to its rank by the process id in the
// file's name.
//
// No library reads PyTorch's collective progress from outside the process
// on gloo (its flight recorder is NCCL-only), hence this package.
package torchhook

import (
	_ "embed"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// SiteCustomize is sitecustomize.py, written into a directory on the
// workers' PYTHONPATH (see [Install]).
//
//go:embed sitecustomize.py
var SiteCustomize []byte

// EnvDir names the directory the hook writes its records to; without it
// the hook only runs the sitecustomize it shadows.
const EnvDir = "GOTRAIN_TORCH_PROGRESS_DIR"

// Comm is the name the default process group's collectives go by in the
// rank's progress: the same on every rank, as the detector needs.
const Comm = "torch-default-pg"

// Install writes the module into pyDir (on the workers' PYTHONPATH) and
// makes outDir, where the records go.
func Install(pyDir, outDir string) error {
	if err := os.MkdirAll(pyDir, 0o700); err != nil {
		return err
	}
	if err := os.MkdirAll(outDir, 0o700); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(pyDir, "sitecustomize.py"), SiteCustomize, 0o600)
}

// The record, little-endian, as sitecustomize.py writes it:
//
//	0   magic "GTHOOK1\n"
//	8   version       uint64, odd while the writer is in the middle
//	16  entered       int64, collectives entered
//	24  completed     int64, every collective up to it has completed
//	32  completedNs   int64, unix ns of the latest completion
//	40  waitNs        int64, total time in completed collectives
//	48  pendingNs     int64, unix ns collective completed+1 was entered (0: none)
//	56  pendingOp     uint32, 1 + index in ops (0: none)
//	60  lastOp        uint32
//	64  ring          16 × int64: the wait of collective s at (s mod 16)
//	192 steps         int64, optimizer steps taken (0: none, or none seen)
//	200 stepNs        int64, unix ns of the latest step
const (
	recordSize = 256
	ringLen    = 16
	ringOff    = 64
	stepsOff   = 192
)

var magic = []byte("GTHOOK1\n")

// ops are the collectives' names by code, as sitecustomize.py's OPS.
var ops = []string{"allreduce", "broadcast", "allgather", "reducescatter", "barrier", "alltoall", "reduce", "gather", "scatter"}

// Progress is one process's record.
type Progress struct {
	Entered, Completed int64
	// CompletedAt is when the latest collective completed; zero when none.
	CompletedAt time.Time
	// Wait is the total time completed collectives took.
	Wait time.Duration
	// PendingOp is the function of collective Completed+1 while it has not
	// completed ("" when none is open); PendingSince is when it was called.
	PendingOp    string
	PendingSince time.Time
	// RecentFirst is the seq of RecentWaits[0]: how long each of the
	// latest completed collectives took (up to 16).
	RecentFirst int64
	RecentWaits []time.Duration
	// Steps is how many optimizer steps the process took (torch.optim),
	// StepAt when the latest ended; 0 and zero when none.
	Steps  int64
	StepAt time.Time
}

// ErrBusy is returned when the writer kept changing the record while it
// was read.
var ErrBusy = errors.New("torchhook: the record changed during every read")

// Read decodes the record at path, retrying while the writer is in the
// middle of an update.
func Read(path string) (Progress, error) {
	f, err := os.Open(path)
	if err != nil {
		return Progress{}, err
	}
	defer f.Close()
	b := make([]byte, recordSize)
	for range 8 {
		if _, err := f.ReadAt(b, 0); err != nil {
			return Progress{}, fmt.Errorf("torchhook: read %s: %w", path, err)
		}
		v1 := binary.LittleEndian.Uint64(b[8:])
		p, err := Decode(b)
		if err != nil {
			return Progress{}, fmt.Errorf("torchhook: %s: %w", path, err)
		}
		var again [8]byte
		if _, err := f.ReadAt(again[:], 8); err != nil {
			return Progress{}, err
		}
		if v1%2 == 0 && binary.LittleEndian.Uint64(again[:]) == v1 {
			return p, nil
		}
		time.Sleep(50 * time.Microsecond)
	}
	return Progress{}, ErrBusy
}

// Decode decodes one record; it does not check the version's parity (Read
// does).
func Decode(b []byte) (Progress, error) {
	if len(b) < recordSize || string(b[:8]) != string(magic) {
		return Progress{}, errors.New("not a gotrain collective record")
	}
	i64 := func(off int) int64 { return int64(binary.LittleEndian.Uint64(b[off:])) }
	p := Progress{Entered: i64(16), Completed: i64(24), Wait: time.Duration(i64(40)), Steps: max(0, i64(stepsOff))}
	if ns := i64(stepsOff + 8); ns > 0 && p.Steps > 0 {
		p.StepAt = time.Unix(0, ns)
	}
	if ns := i64(32); ns > 0 {
		p.CompletedAt = time.Unix(0, ns)
	}
	if code := binary.LittleEndian.Uint32(b[56:]); code > 0 && int(code) <= len(ops) && p.Entered > p.Completed {
		p.PendingOp = ops[code-1]
		if ns := i64(48); ns > 0 {
			p.PendingSince = time.Unix(0, ns)
		}
	}
	if p.Completed > 0 {
		p.RecentFirst = max(1, p.Completed-ringLen+1)
		for s := p.RecentFirst; s <= p.Completed; s++ {
			p.RecentWaits = append(p.RecentWaits, time.Duration(i64(ringOff+8*int(s%ringLen))))
		}
	}
	return p, nil
}

// Records lists the records in dir by the pid that writes each.
func Records(dir string) (map[int]string, error) { return listBySuffix(dir, ".progress") }

// listBySuffix lists the files PID+suffix in dir by pid.
func listBySuffix(dir, suffix string) (map[int]string, error) {
	es, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	out := map[int]string{}
	for _, e := range es {
		s, ok := strings.CutSuffix(e.Name(), suffix)
		if !ok {
			continue
		}
		if pid, err := strconv.Atoi(s); err == nil && pid > 0 {
			out[pid] = filepath.Join(dir, e.Name())
		}
	}
	return out, nil
}
