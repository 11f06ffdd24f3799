package observe

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/gotrain/gotrain/internal/torchhook"
	gotrainv1 "github.com/gotrain/gotrain/proto/gotrain/v1"
)

// Collective-level progress of PyTorch ranks on gloo.
//
// The agent puts package torchhook's sitecustomize on its workers'
// PYTHONPATH with a records directory beside its socket; a PyTorch rank
// on a gloo default group keeps its collective counts in DIR/PID.progress.
// Each progress report (the relay's Hub.batch) reads the records and gives every
// unattached rank whose process (the worker or a descendant of it) keeps
// one its comm torchhook.Comm (comms_source "torch-hook"), so the
// coordinator's detector judges a gloo rank that stops calling collectives
// like a Go worker that does. NCCL jobs have no records (the hook counts
// gloo only) and are read from NCCL RAS (raspoll.go).

// CommsSourceTorchHook marks progress read from the PyTorch hook's records.
const CommsSourceTorchHook = "torch-hook"

// TorchProgress reads the records in dir.
type TorchProgress struct {
	dir string
	// parents returns a process's parent pid, 0 when unknown.
	parents func(pid int) int
	now     func() time.Time
}

// InstallTorchHook writes the hook into pyDir and makes its records
// directory in dir; an error (no view) when it cannot.
func InstallTorchHook(pyDir, dir string) (*TorchProgress, error) {
	out := filepath.Join(dir, "progress")
	if err := torchhook.Install(pyDir, out); err != nil {
		return nil, err
	}
	return &TorchProgress{dir: out, parents: parentPid, now: time.Now}, nil
}

// Dir is the records directory, for the workers' environment
// (torchhook.EnvDir).
func (tp *TorchProgress) Dir() string { return tp.dir }

// Read returns the records of the ranks in pids (rank -> worker pid) by
// rank, and removes the records of processes that are gone.
func (tp *TorchProgress) Read(pids map[int]int) map[int]torchhook.Progress {
	if tp == nil {
		return nil
	}
	tp.removeGoneStacks()
	if len(pids) == 0 {
		return nil
	}
	recs, err := torchhook.Records(tp.dir)
	if err != nil || len(recs) == 0 {
		return nil
	}
	byPid := make(map[int]int, len(pids))
	for r, pid := range pids {
		byPid[pid] = r
	}
	out := map[int]torchhook.Progress{}
	for pid, path := range recs {
		if !alive(pid) {
			// A rank's own process whose exit the agent has not taken yet:
			// its report reads the record (StepsOf).
			if _, rank := byPid[pid]; !rank {
				_ = os.Remove(path)
			}
			continue
		}
		r, ok := tp.rankOf(pid, byPid)
		if !ok {
			continue
		}
		p, err := torchhook.Read(path)
		if err != nil {
			continue
		}
		// Two live recorders under one rank (a program that runs another
		// that uses torch.distributed): the one further along.
		if q, seen := out[r]; !seen || p.Entered > q.Entered {
			out[r] = p
		}
	}
	return out
}

// StepsOf returns the optimizer steps the record of process pid holds (it
// may have exited: its record stays until its rank's exit was taken);
// false when it has none.
func (tp *TorchProgress) StepsOf(pid int) (int64, bool) {
	if tp == nil {
		return 0, false
	}
	p, err := torchhook.Read(filepath.Join(tp.dir, fmt.Sprintf("%d.progress", pid)))
	if err != nil || p.Steps <= 0 {
		return 0, false
	}
	return p.Steps, true
}

// removeGoneStacks removes the stacks files of processes that are gone.
func (tp *TorchProgress) removeGoneStacks() {
	files, _ := torchhook.StacksFiles(tp.dir)
	for pid, path := range files {
		if !alive(pid) {
			_ = os.Remove(path)
		}
	}
}

// rankOf finds the rank whose worker is pid or an ancestor of pid.
func (tp *TorchProgress) rankOf(pid int, byPid map[int]int) (int, bool) {
	for hops := 0; pid > 1 && hops < 8; pid, hops = tp.parents(pid), hops+1 {
		if r, ok := byPid[pid]; ok {
			return r, true
		}
	}
	return 0, false
}

// alive reports whether process pid exists.
func alive(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || !errors.Is(err, syscall.ESRCH)
}

// StepSourceTorchHook marks a step counted by the PyTorch hook (optimizer
// steps).
const StepSourceTorchHook = "torch-hook"

// Annotate puts rank's record p into its report: its optimizer steps, and
// its collectives when it called any (a rank on NCCL, or before its first
// collective, has steps only; AnnotateComms says whether it has them).
func (tp *TorchProgress) Annotate(p torchhook.Progress, rp *gotrainv1.RankProgress) {
	rp.UnixNanos = tp.now().UnixNano()
	if p.Steps > 0 {
		rp.Step, rp.StepSource = p.Steps, StepSourceTorchHook
	}
	if !HasComms(p) {
		return
	}
	c := &gotrainv1.CommProgress{Comm: torchhook.Comm, EnteredSeq: p.Entered, CompletedSeq: p.Completed,
		WaitNanos: int64(p.Wait), RecentFirst: p.RecentFirst}
	if !p.CompletedAt.IsZero() {
		c.CompletedUnixNanos = p.CompletedAt.UnixNano()
	}
	for _, w := range p.RecentWaits {
		c.RecentWaitNanos = append(c.RecentWaitNanos, int64(w))
	}
	if p.PendingOp != "" {
		c.Pending = &gotrainv1.Collective{Seq: p.Completed + 1, Op: p.PendingOp, Root: -1, State: "started"}
		if !p.PendingSince.IsZero() {
			c.Pending.EnqueuedUnixNanos = p.PendingSince.UnixNano()
		}
	}
	rp.Comms = []*gotrainv1.CommProgress{c}
	rp.CommsSource = CommsSourceTorchHook
}

// HasComms says whether record p counted collectives (of a gloo default
// group).
func HasComms(p torchhook.Progress) bool { return p.Entered > 0 }
