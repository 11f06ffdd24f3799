// Hang detection: watching each communicator on every Tick, timing stalls,
// recording verdicts, the post mortem, and the verdicts in force. The
// straggler check is in hang_straggler.go; explaining a stall in
// hang_classify.go.
//
// Workers report, per communicator, the last collective they entered and the
// last they completed, the oldest one still pending (op, dtype, count, root,
// when it was entered), and the total time completed collectives waited. On
// every Tick the machine looks at each communicator: when its lowest
// completed seq M has not moved for the hang timeout while some rank has
// work pending, the job hangs at collective K = M+1, and the machine returns
// a [HangDetected] with a [Verdict] that names the culprits:
//
//   - [VerdictProcess]: a rank's process exited, is stopped (SIGSTOP, a
//     debugger: state T) or sleeps uninterruptibly (D) or is a zombie;
//   - [VerdictMismatch]: the ranks in #K issued different collectives (op,
//     dtype, count, root or reduction); the odd ones out are the culprits;
//   - [VerdictNeverEntered]: some ranks never entered #K while the others
//     wait in it;
//   - [VerdictStuck]: every rank entered #K and none finished: the transport
//     or a GPU.
//
// The stall is timed from the later of the last completion of #M and the
// moment the first rank entered #K, so a long compute phase between
// collectives is not a hang: no rank is pending while it runs.
//
// The hang timeout is Config.HangTimeout when one is given; else it adapts
// to the communicator's rhythm: max(3 x its p99 interval between
// completions, 1s), warm-up left out (package internal/coordinator/rhythm), and
// DefaultHangTimeout until enough intervals are in.
//
// Separately, [VerdictStraggler] names a rank that the others consistently
// wait for: its compute per collective exceeds the others' median by 20 %
// or more on several judgements in a row (hang_straggler.go, package
// internal/coordinator/rhythm). It is a finding, not a hang, and never restarts the
// job; with Config.OnStraggler replace, one that persists replaces its rank
// (straggler_replace.go).
//
// When a generation ends by a failure, the machine looks once more at the
// ranks' last collectives (a post mortem): backends that detect mismatches
// themselves (the CPU backend compares a header per collective) fail fast
// instead of hanging, and the mismatch verdict then names the culprit in the
// job's failure message.

package job

import (
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/gotrain/gotrain/internal/coordinator/rhythm"
)

const (
	// maxEvidenceRanks bounds how many ranks a verdict collects evidence of.
	maxEvidenceRanks = 8
	// suspectAfter is how long a communicator must stall before Diagnose
	// shows it as suspected.
	suspectAfter = time.Second
)

// hangState is the detector's memory; it belongs to one generation.
type hangState struct {
	gen   int64
	comms map[string]*commWatch
	// paces learn each communicator's rhythm; they outlive a generation.
	paces      map[string]*rhythm.Pace
	verdicts   []Verdict
	nextID     int64
	postMortem bool // the post mortem of gen ran
}

type commWatch struct {
	min        int64 // lowest completed seq
	minSet     bool
	progressAt time.Time // when min was reached
	fired      bool      // a verdict fired for this stall
	judge      *rhythm.Judge
}

// rankView is one rank's state in one communicator.
type rankView struct {
	rank               int
	r                  *rank
	p                  *Progress     // nil when the rank never reported
	c                  *CommProgress // nil when it reported nothing for the comm
	entered, completed int64
}

func (h *hangState) reset(gen int64) {
	paces := h.paces
	if paces == nil {
		paces = map[string]*rhythm.Pace{}
	}
	for _, name := range slices.Sorted(maps.Keys(paces)) {
		paces[name].Restart()
	}
	*h = hangState{gen: gen, nextID: h.nextID, comms: map[string]*commWatch{}, paces: paces}
}

// pace returns communicator name's rhythm.
func (h *hangState) pace(name string) *rhythm.Pace {
	p := h.paces[name]
	if p == nil {
		p = rhythm.NewPace(rhythm.PaceConfig{})
		h.paces[name] = p
	}
	return p
}

// hangTimeout returns the hang timeout of communicator name, and whether it
// is the adaptive one.
func (m *Machine) hangTimeout(name string) (time.Duration, bool) {
	if m.cfg.HangTimeout > 0 {
		return m.cfg.HangTimeout, false
	}
	if p := m.hang.paces[name]; p != nil {
		if d, ok := p.Timeout(); ok {
			return d, true
		}
	}
	return DefaultHangTimeout, true
}

// HangTimeout returns the longest hang timeout in force over the current
// communicators (DefaultHangTimeout, or the given one, when there are none),
// and whether it is adaptive.
func (m *Machine) HangTimeout() (time.Duration, bool) {
	if m.cfg.HangTimeout > 0 {
		return m.cfg.HangTimeout, false
	}
	var longest time.Duration
	for _, name := range m.commNames() {
		d, _ := m.hangTimeout(name)
		longest = max(longest, d)
	}
	if longest == 0 {
		longest = DefaultHangTimeout
	}
	return longest, true
}

// hangTick runs the detector. It is called on every Tick.
func (m *Machine) hangTick() []Action {
	h := &m.hang
	if h.comms == nil || h.gen != m.gen {
		h.reset(m.gen)
	}
	if m.state != StateRunning {
		return nil
	}
	var acts []Action
	for _, name := range m.commNames() {
		w := h.comms[name]
		if w == nil {
			w = &commWatch{judge: rhythm.NewJudge(rhythm.JudgeConfig{})}
			h.comms[name] = w
		}
		vs := m.viewOf(name)
		low, at := lowest(vs)
		if !w.minSet || low != w.min {
			w.min, w.minSet, w.fired = low, true, false
			w.progressAt = reachedAt(low, at, m.now)
			h.drop(name, false)
			h.pace(name).Advance(low, w.progressAt, m.now)
		}
		timeout, adaptive := m.hangTimeout(name)
		if since, ok := stallStart(vs, w.progressAt); ok && !w.fired && m.now.Sub(since) >= timeout {
			w.fired = true
			v := m.classify(name, vs, since, false)
			v.Timeout, v.Adaptive = timeout, adaptive
			if adaptive {
				v.Details = append(v.Details, timeoutWords(name, timeout, h.pace(name)))
			}
			acts = append(acts, m.record(v, false))
			if m.cfg.OnHang == OnHangRestart {
				return append(acts, m.endForHang(v)...)
			}
		}
		acts = append(acts, m.stragglerCheck(name, w, vs)...)
	}
	return append(acts, m.replaceTick()...) // straggler_replace.go
}

// commNames returns the communicators the current generation's ranks report.
func (m *Machine) commNames() []string {
	var names []string
	for _, r := range m.ranks {
		if r.progress == nil {
			continue
		}
		for _, c := range r.progress.Comms {
			if !slices.Contains(names, c.Comm) {
				names = append(names, c.Comm)
			}
		}
	}
	slices.Sort(names)
	return names
}

// viewOf returns every rank's state in communicator name.
func (m *Machine) viewOf(name string) []rankView {
	vs := make([]rankView, len(m.ranks))
	for i := range m.ranks {
		v := rankView{rank: i, r: &m.ranks[i], p: m.ranks[i].progress}
		if v.p != nil {
			for j := range v.p.Comms {
				if v.p.Comms[j].Comm == name {
					v.c = &v.p.Comms[j]
					v.entered, v.completed = v.c.EnteredSeq, v.c.CompletedSeq
				}
			}
		}
		vs[i] = v
	}
	return vs
}

// lowest returns the lowest completed seq and when it was reached: the latest
// completion among the ranks at it (their clocks, never later than the
// report's arrival).
func lowest(vs []rankView) (int64, time.Time) {
	low := int64(-1)
	for _, v := range vs {
		if low < 0 || v.completed < low {
			low = v.completed
		}
	}
	var at time.Time
	for _, v := range vs {
		if v.completed != low || v.c == nil || v.c.CompletedTime.IsZero() {
			continue
		}
		t := v.c.CompletedTime
		if v.p.Received.Before(t) {
			t = v.p.Received
		}
		if t.After(at) {
			at = t
		}
	}
	return low, at
}

// reachedAt is when the lowest completed seq was reached: at, or now when
// the workers did not say. Before the first completion there is nothing to
// wait from (the zero time): the stall starts with the first entry.
func reachedAt(low int64, at, now time.Time) time.Time {
	if at.IsZero() && low > 0 {
		return now
	}
	return at
}

// stallStart returns when the current stall began, and false when no rank
// has work pending: the later of progressAt and the earliest entry into a
// pending collective.
func stallStart(vs []rankView, progressAt time.Time) (time.Time, bool) {
	var first time.Time
	pending := false
	for _, v := range vs {
		if v.entered <= v.completed {
			continue
		}
		pending = true
		t := v.p.Received
		if v.c.Pending != nil && !v.c.Pending.Enqueued.IsZero() && v.c.Pending.Enqueued.Before(t) {
			t = v.c.Pending.Enqueued
		}
		if first.IsZero() || t.Before(first) {
			first = t
		}
	}
	if !pending {
		return time.Time{}, false
	}
	if progressAt.After(first) {
		return progressAt, true
	}
	return first, true
}

// record gives v an id, keeps it in force, and returns the action that
// reports it.
func (m *Machine) record(v Verdict, postMortem bool) Action {
	h := &m.hang
	h.nextID++
	v.ID = h.nextID
	v.Detected = m.now
	h.verdicts = append(h.verdicts, v)
	a := HangDetected{Verdict: copyVerdict(v), PostMortem: postMortem}
	if postMortem {
		return a
	}
	var ranks []int
	for _, c := range v.Culprits {
		ranks = append(ranks, c.Rank)
	}
	if len(ranks) == 0 {
		ranks = v.Waiting
	}
	byNode := map[string][]int{}
	var nodes []string
	for _, r := range ranks {
		if len(byNode) >= maxEvidenceRanks || r < 0 || r >= len(m.ranks) {
			continue
		}
		if m.ranks[r].state != RankRunning {
			continue
		}
		id := m.ranks[r].nodeID
		if _, ok := byNode[id]; !ok {
			nodes = append(nodes, id)
		}
		byNode[id] = append(byNode[id], r)
	}
	for _, id := range nodes {
		a.Collect = append(a.Collect, EvidenceTarget{NodeID: id, Ranks: byNode[id]})
	}
	return a
}

// drop removes the verdicts of communicator name: its hang verdict, or its
// straggler verdict.
func (h *hangState) drop(name string, straggler bool) {
	h.verdicts = slices.DeleteFunc(h.verdicts, func(v Verdict) bool {
		return v.Comm == name && (v.Kind == VerdictStraggler) == straggler
	})
}

// endForHang ends the generation for a hang (Config.OnHang restart).
func (m *Machine) endForHang(v Verdict) []Action {
	f := &Failure{Rank: -1, Reason: "hang: " + v.Summary}
	switch {
	case len(v.Culprits) > 0:
		c := v.Culprits[0]
		f.Rank, f.NodeID, f.Hostname, f.Pid = c.Rank, c.NodeID, c.Hostname, c.Pid
	case len(v.Waiting) > 0:
		r := v.Waiting[0]
		f.Rank, f.NodeID, f.Hostname = r, m.ranks[r].nodeID, m.ranks[r].hostname
		if p := m.ranks[r].progress; p != nil {
			f.Pid = p.Pid
		}
	}
	return append(m.end(f, "hang detected: "+v.Summary), m.afterEnd()...)
}

// postMortem looks at the last collectives of a generation that ended by a
// failure, once every rank is accounted for, and reports a mismatch if the
// ranks disagreed. It runs once per generation.
func (m *Machine) postMortem() []Action {
	h := &m.hang
	if h.comms == nil || h.gen != m.gen {
		h.reset(m.gen)
	}
	if h.postMortem || m.failure == nil {
		return nil
	}
	h.postMortem = true
	var acts []Action
	for _, name := range m.commNames() {
		vs := m.viewOf(name)
		v := m.classify(name, vs, m.now, true)
		if v.Kind != VerdictMismatch {
			continue
		}
		v.Summary = fmt.Sprintf("mismatch at #%d of comm %q: %s", v.Collective.Seq, name, mismatchWords(v))
		for i, c := range v.Culprits {
			if rv := vs[c.Rank]; c.Collective != nil && rv.c != nil {
				v.Culprits[i].Doing = fmt.Sprintf("called %s", seqName(*c.Collective))
				if rv.c.Error != "" {
					v.Culprits[i].Doing += " and failed: " + rv.c.Error
				}
				v.Details[i] = fmt.Sprintf("%s: %s", who(c), v.Culprits[i].Doing)
			}
		}
		acts = append(acts, m.record(v, true))
		m.reason += "; " + v.Summary
		if m.failure != nil {
			m.failure.Notes = append(m.failure.Notes, "hang detector: "+v.Summary)
		}
	}
	return acts
}

// evidence attaches an agent's evidence to the verdict it answers.
func (m *Machine) evidence(ev EvidenceReported) {
	for i := range m.hang.verdicts {
		if m.hang.verdicts[i].ID == ev.VerdictID {
			m.hang.verdicts[i].Evidence = append(m.hang.verdicts[i].Evidence, slices.Clone(ev.Evidence)...)
			return
		}
	}
}

// Verdicts returns the verdicts in force for the current generation.
func (m *Machine) Verdicts() []Verdict {
	if m.hang.gen != m.gen {
		return nil
	}
	out := make([]Verdict, 0, len(m.hang.verdicts))
	for _, v := range m.hang.verdicts {
		out = append(out, copyVerdict(v))
	}
	return out
}

// Suspected returns, for each communicator stalled for more than a second
// with work pending but not yet past the hang timeout, what the detector
// would say now. It changes nothing.
func (m *Machine) Suspected(now time.Time) []Verdict {
	if m.state != StateRunning {
		return nil
	}
	saved := m.now
	m.now = now
	defer func() { m.now = saved }()
	var out []Verdict
	for _, name := range m.commNames() {
		vs := m.viewOf(name)
		low, at := lowest(vs)
		progressAt := reachedAt(low, at, now)
		if w := m.hang.comms[name]; w != nil && m.hang.gen == m.gen && w.minSet && w.min == low {
			if w.fired {
				continue // a verdict is in force
			}
			progressAt = w.progressAt
		}
		since, ok := stallStart(vs, progressAt)
		if !ok || now.Sub(since) < suspectAfter {
			continue
		}
		out = append(out, m.classify(name, vs, since, false))
	}
	return out
}
