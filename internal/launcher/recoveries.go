package launcher

import (
	"strings"
	"time"

	"github.com/gotrain/gotrain/internal/launcher/observe"
	"github.com/gotrain/gotrain/internal/launcher/recovery"
	"github.com/gotrain/gotrain/internal/torchhook"
	gotrainv1 "github.com/gotrain/gotrain/proto/gotrain/v1"
)

// Every restart timed, phase by phase: the shell's half (package recovery
// decides). The loop notes when this node saw the failure, when the
// coordinator ended the generation, when the old processes were gone,
// when the next one started and each rank's process with it; each tick it
// reads what the torch hook recorded in the new processes
// (torchhook.ReadFacts). Once every new rank took its first step (or
// recoveryWait passed), it reports the timing: one line on stderr, a
// "recovered" log record (--log-format json), recovery.json in the log dir
// (and root-cause.json's recoveries), and the coordinator's histograms
// (relay.Hub.AddRecovery).

// recoveryWait is how long after the generation started a recovery whose
// program phases have not all come is reported with what is known.
const recoveryWait = 3 * time.Minute

// recoveryWatch is one node's restart being timed. Only the loop's
// goroutine uses it.
type recoveryWatch struct {
	failed, ended, lastExit time.Time // the generation that ends
	facts                   *recovery.Facts
	pids                    map[int]int // rank -> pid of the new generation's processes
	deadline                time.Time
	// done are the restarts reported, for root-cause.json.
	done []recovery.Timing
}

// failure: a rank of this node failed (its own exit, not one the agent
// caused).
func (w *recoveryWatch) failure(now time.Time) {
	if w.failed.IsZero() {
		w.failed = now
	}
}

// exited: a worker of this node exited.
func (w *recoveryWatch) exited(now time.Time) { w.lastExit = now }

// generationEnded: the coordinator ended the generation.
func (w *recoveryWatch) generationEnded(now time.Time) {
	if w.ended.IsZero() {
		w.ended = now
	}
}

// generationStarted begins timing generation gen, when one ended before
// it; program says whether the ranks' programs record their phases. An
// unfinished watch of an earlier generation is handed back to report.
func (w *recoveryWatch) generationStarted(now time.Time, gen int64, program bool) (unfinished *recovery.Facts) {
	unfinished = w.facts
	w.facts, w.pids = nil, nil
	if !w.ended.IsZero() {
		stopped := w.ended
		if w.lastExit.After(stopped) {
			stopped = w.lastExit
		}
		w.facts = &recovery.Facts{Generation: gen, Failed: w.failed, Ended: w.ended, Stopped: stopped, Started: now, Program: program}
		w.pids = map[int]int{}
		w.deadline = now.Add(recoveryWait)
	}
	w.failed, w.ended, w.lastExit = time.Time{}, time.Time{}, time.Time{}
	return unfinished
}

// rankStarted: rank of generation gen got process pid now, a standby's or
// a new one.
func (w *recoveryWatch) rankStarted(now time.Time, gen int64, rank, pid int, standby bool) {
	if w.facts == nil || w.facts.Generation != gen {
		return
	}
	w.facts.Ranks = append(w.facts.Ranks, recovery.Rank{Rank: rank, Started: now, Standby: standby})
	w.pids[rank] = pid
}

// poll reads the new processes' records from dir and returns the timing
// once it is complete or due.
func (w *recoveryWatch) poll(now time.Time, dir string) (recovery.Timing, bool) {
	if w.facts == nil || len(w.facts.Ranks) == 0 {
		return recovery.Timing{}, false
	}
	if w.facts.Program && dir != "" {
		for i := range w.facts.Ranks {
			r := &w.facts.Ranks[i]
			fs, err := torchhook.ReadFacts(torchhook.PhasesPath(dir, w.pids[r.Rank]))
			if err != nil {
				continue
			}
			r.Events = r.Events[:0]
			for _, p := range fs.Phases {
				if p.End.Before(r.Started) {
					continue // an earlier process's under the same pid, or the standby's before it had the rank
				}
				r.Events = append(r.Events, recovery.Event{Name: p.Phase, Start: p.Start, End: p.End, Seconds: p.Seconds, Bytes: p.Bytes, Source: p.Source, Step: p.Step})
			}
		}
	}
	t := recovery.Decide(*w.facts)
	if len(t.Missing) > 0 && now.Before(w.deadline) {
		return t, false
	}
	w.facts, w.pids = nil, nil
	w.done = append(w.done, t)
	return t, true
}

// pollRecovery reports the current restart's timing once it is known
// (called each tick).
func (a *agent) pollRecovery(now time.Time) {
	if t, ok := a.recov.poll(now, a.torchDir()); ok {
		a.reportRecovery(t)
	}
}

// torchDir is the torch hook's records directory, "" without the hook.
func (a *agent) torchDir() string {
	if a.hub == nil || a.hub.Torch() == nil {
		return ""
	}
	return a.hub.Torch().Dir()
}

// reportRecovery says where a restart's time went: stderr, the log, the
// log dir, the coordinator's histograms.
func (a *agent) reportRecovery(t recovery.Timing) {
	a.stderr.WriteLine("", []byte(t.Line()))
	attrs := []any{"generation", t.Generation, "rank", t.Rank, "seconds", round3(t.Total)}
	for _, p := range t.Phases {
		attrs = append(attrs, strings.ReplaceAll(p.Name, " ", "_"), round3(p.Seconds))
		if p.Name == recovery.Started {
			attrs = append(attrs, "start", p.Detail)
		}
	}
	if t.Restore != nil {
		attrs = append(attrs, "restore_bytes", t.Restore.Bytes, "restore_source", t.Restore.Source, "restore_step", t.Restore.Step)
	}
	if len(t.Missing) > 0 {
		attrs = append(attrs, "missing", strings.Join(t.Missing, ","))
	}
	a.log.Info("recovered", attrs...)
	if a.cfg.LogDir != "" {
		if err := observe.RecordRecoveries(a.cfg.LogDir, a.cfg.RunID, a.recov.done); err != nil {
			a.logTrouble.Warn(err)
		}
	}
	if a.hub != nil {
		a.hub.AddRecovery(recoveryWire(t))
	}
}

func round3(s float64) float64 { return float64(int64(s*1000+0.5)) / 1000 }

// recoveryWire is t as the coordinator gets it.
func recoveryWire(t recovery.Timing) *gotrainv1.RecoveryTiming {
	w := &gotrainv1.RecoveryTiming{Generation: t.Generation, Rank: int32(t.Rank), Seconds: t.Total}
	for _, p := range t.Phases {
		w.Phases = append(w.Phases, &gotrainv1.RecoveryPhase{Name: p.Name, Seconds: p.Seconds, Detail: p.Detail})
	}
	return w
}
