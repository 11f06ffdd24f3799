package job

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// Hang detection.
//
// Workers report, per communicator, the last collective they entered and the
// last they completed, the oldest one still pending (op, dtype, count, root,
// when it was entered), and the total time completed collectives waited. On
// every Tick the machine looks at each communicator: when its lowest
// completed seq M has not moved for Config.HangTimeout while some rank has
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
// Separately, [VerdictStraggler] names a rank that the others consistently
// wait for: its mean time inside collectives is smaller than the others' by
// more than Config.StragglerThreshold over several ticks. It is a finding,
// not a hang, and never restarts the job.
//
// When a generation ends by a failure, the machine looks once more at the
// ranks' last collectives (a post mortem): backends that detect mismatches
// themselves (the CPU backend compares a header per collective) fail fast
// instead of hanging, and the mismatch verdict then names the culprit in the
// job's failure message.

// VerdictKind classifies a verdict.
type VerdictKind string

const (
	VerdictNeverEntered VerdictKind = "never-entered"
	VerdictMismatch     VerdictKind = "mismatch"
	VerdictStuck        VerdictKind = "stuck"
	VerdictProcess      VerdictKind = "process"
	VerdictStraggler    VerdictKind = "straggler"
)

// What the machine does when it detects a hang (Config.OnHang).
const (
	// OnHangReport reports the verdict and lets the job hang.
	OnHangReport = "report"
	// OnHangRestart also ends the generation through the failure path, which
	// restarts the job while restarts remain.
	OnHangRestart = "restart"
)

// Default detector settings.
const (
	DefaultHangTimeout        = 120 * time.Second
	DefaultStragglerThreshold = time.Second
)

const (
	// stragglerWindow is how far back the straggler check looks.
	stragglerWindow = 30 * time.Second
	// stragglerMinCollectives is how many collectives each rank must have
	// completed in the window for the check to judge.
	stragglerMinCollectives = 4
	// stragglerStreak is how many consecutive ticks must name the same rank.
	stragglerStreak = 3
	// maxEvidenceRanks bounds how many ranks a verdict collects evidence of.
	maxEvidenceRanks = 8
	// suspectAfter is how long a communicator must stall before Diagnose
	// shows it as suspected.
	suspectAfter = time.Second
)

// Collective is one collective as a rank issued it.
type Collective struct {
	Seq      int64
	Op       string // "allreduce", "broadcast", "allgather", "reducescatter", "barrier", ...
	DType    string
	Count    int64
	Root     int // broadcast root or point-to-point peer, -1 for none
	ReduceOp string
	State    string // "enqueued", "started", "completed", "failed"
	Enqueued time.Time
}

// Shape describes the collective without its seq: "allreduce (float32 sum,
// 1024 elements)".
func (c Collective) Shape() string {
	if c.Op == "" {
		return "an unknown collective"
	}
	var parts []string
	if c.DType != "" {
		parts = append(parts, strings.TrimSpace(c.DType+" "+c.ReduceOp))
	}
	if c.Count > 0 || c.DType != "" {
		parts = append(parts, plural(int(c.Count), "element"))
	}
	if c.Root >= 0 && c.Op != "allreduce" && c.Op != "allgather" && c.Op != "reducescatter" && c.Op != "barrier" {
		parts = append(parts, fmt.Sprintf("root %d", c.Root))
	}
	if len(parts) == 0 {
		return c.Op
	}
	return fmt.Sprintf("%s (%s)", c.Op, strings.Join(parts, ", "))
}

// signature is what every rank must agree on.
func (c Collective) signature() string {
	return fmt.Sprintf("%s|%s|%d|%d|%s", c.Op, c.DType, c.Count, c.Root, c.ReduceOp)
}

// Culprit is a rank a verdict blames, and what it was doing.
type Culprit struct {
	Rank      int
	NodeID    string
	Hostname  string
	Pid       int
	GPU       int // index on the node, -1 for none
	GPUUUID   string
	ProcState string // "R", "S", "D", "T", "Z", "exited", "" when unknown
	Doing     string
	// Collective is the collective the rank was in, nil if none.
	Collective *Collective
}

// Evidence is what an agent found about a rank: its goroutine stacks, a
// py-spy dump, /proc files, GPU state.
type Evidence struct {
	Rank int
	Pid  int
	Kind string // "goroutines", "py-spy", "proc", "gpu", "error"
	Text string
}

// Verdict is the hang detector's finding for one communicator.
type Verdict struct {
	ID         int64
	Kind       VerdictKind
	Generation int64
	Comm       string
	// Collective is the collective the job is stuck at, as the waiting ranks
	// issued it (Seq is the lowest completed seq + 1).
	Collective Collective
	// Since is when the stall began: the later of the last completion and
	// the first rank's entry into Collective.
	Since    time.Time
	Detected time.Time
	Summary  string
	Details  []string
	Culprits []Culprit
	// Waiting are the ranks that entered Collective and wait in it.
	Waiting  []int
	Evidence []Evidence
}

// HangDetected: the detector fired (or a post mortem found a mismatch).
// The caller logs the verdict, tells the agents, and asks the agents named in
// Collect for evidence, answered with [EvidenceReported].
type HangDetected struct {
	Verdict Verdict
	// Collect lists, by node, the ranks whose evidence is wanted; empty when
	// their processes are gone.
	Collect []EvidenceTarget
	// PostMortem: the generation had ended already when the verdict was made.
	PostMortem bool
}

// EvidenceTarget is the ranks of one node to collect evidence of.
type EvidenceTarget struct {
	NodeID string
	Ranks  []int
}

func (HangDetected) isAction() {}

// EvidenceReported: an agent answers a HangDetected's request for evidence.
// Evidence for a verdict no longer in force is dropped.
type EvidenceReported struct {
	NodeID    string
	VerdictID int64
	Evidence  []Evidence
}

func (EvidenceReported) isEvent() {}

// hangState is the detector's memory; it belongs to one generation.
type hangState struct {
	gen        int64
	comms      map[string]*commWatch
	verdicts   []Verdict
	nextID     int64
	postMortem bool // the post mortem of gen ran
}

type commWatch struct {
	min        int64 // lowest completed seq
	minSet     bool
	progressAt time.Time // when min was reached
	fired      bool      // a verdict fired for this stall
	strag      stragglerWatch
}

type stragglerWatch struct {
	samples map[int][]waitSample
	cand    int
	streak  int
	on      bool
}

type waitSample struct {
	at   time.Time
	seq  int64
	wait time.Duration
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
	*h = hangState{gen: gen, nextID: h.nextID, comms: map[string]*commWatch{}}
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
			w = &commWatch{strag: stragglerWatch{samples: map[int][]waitSample{}, cand: -1}}
			h.comms[name] = w
		}
		vs := m.viewOf(name)
		low, at := lowest(vs)
		if !w.minSet || low != w.min {
			w.min, w.minSet, w.fired = low, true, false
			w.progressAt = reachedAt(low, at, m.now)
			h.drop(name, false)
		}
		if since, ok := stallStart(vs, w.progressAt); ok && !w.fired && m.now.Sub(since) >= m.cfg.HangTimeout {
			w.fired = true
			v := m.classify(name, vs, since, false)
			acts = append(acts, m.record(v, false))
			if m.cfg.OnHang == OnHangRestart {
				return append(acts, m.endForHang(v)...)
			}
		}
		acts = append(acts, m.stragglerCheck(name, w, vs)...)
	}
	return acts
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

// badProcess reports whether a rank's process cannot make progress: it
// exited, or it is stopped, in uninterruptible sleep, or a zombie.
func badProcess(v rankView) (string, bool) {
	switch v.r.state {
	case RankExited, RankFailed, RankStopped, RankLost:
		return "exited", true
	}
	if v.p == nil {
		return "", false
	}
	switch v.p.ProcState {
	case "T", "t", "D", "Z", "X":
		return v.p.ProcState, true
	}
	return v.p.ProcState, false
}

// classify explains a stall of communicator name at collective low+1.
//
// A post mortem (the generation ended by a failure) ignores the processes'
// states: they all exited by then.
func (m *Machine) classify(name string, vs []rankView, since time.Time, postMortem bool) Verdict {
	// The job is stuck where the pending ranks wait; a rank whose last
	// report is older (a stopped process cannot report) may show less.
	low, _ := lowest(vs)
	k := low + 1
	first := true
	for _, rv := range vs {
		if rv.entered > rv.completed && (first || rv.completed+1 < k) {
			k, first = rv.completed+1, false
		}
	}
	v := Verdict{Kind: VerdictStuck, Generation: m.gen, Comm: name, Since: since, Detected: m.now}
	var missing []rankView
	groups := map[string][]int{}
	var order []string // signatures in rank order of first appearance
	shapes := map[string]Collective{}
	for _, rv := range vs {
		if rv.entered < k {
			missing = append(missing, rv)
			continue
		}
		v.Waiting = append(v.Waiting, rv.rank)
		if p := rv.c.Pending; p != nil && p.Seq == k {
			sig := p.signature()
			if _, ok := groups[sig]; !ok {
				order = append(order, sig)
				shapes[sig] = *p
			}
			groups[sig] = append(groups[sig], rv.rank)
		}
	}
	// The majority's collective is the one the job is at; ties go to the
	// group of the lowest rank.
	major := ""
	for _, sig := range order {
		if major == "" || len(groups[sig]) > len(groups[major]) {
			major = sig
		}
	}
	v.Collective = Collective{Seq: k, Root: -1}
	if major != "" {
		v.Collective = shapes[major]
		v.Collective.Seq = k
	}
	stalled := m.now.Sub(since).Round(100 * time.Millisecond)
	at := fmt.Sprintf("%s of comm %q", seqName(v.Collective), name)

	var bad []rankView
	for _, rv := range vs {
		if _, ok := badProcess(rv); ok && !postMortem {
			bad = append(bad, rv)
		}
	}
	switch {
	case len(bad) > 0:
		v.Kind = VerdictProcess
		var what []string
		for _, rv := range bad {
			c := m.culprit(rv, k)
			v.Culprits = append(v.Culprits, c)
			what = append(what, fmt.Sprintf("%s %s", who(c), c.Doing))
		}
		v.Summary = fmt.Sprintf("%s; the job waits at %s for %s", strings.Join(what, "; "), at, stalled)
	case len(groups) > 1:
		v.Kind = VerdictMismatch
		var odd []string
		for _, sig := range order {
			if sig == major {
				continue
			}
			for _, r := range groups[sig] {
				c := m.culprit(vs[r], k)
				v.Culprits = append(v.Culprits, c)
			}
			odd = append(odd, fmt.Sprintf("%s called %s", rankList(groups[sig]), shapes[sig].Shape()))
		}
		v.Summary = fmt.Sprintf("mismatch at #%d of comm %q: %s where %s called %s; waiting for %s",
			k, name, strings.Join(odd, "; "), rankList(groups[major]), shapes[major].Shape(), stalled)
	case len(missing) > 0 && len(v.Waiting) > 0:
		v.Kind = VerdictNeverEntered
		for _, rv := range missing {
			v.Culprits = append(v.Culprits, m.culprit(rv, k))
		}
		v.Summary = fmt.Sprintf("%s never entered %s; %s in it for %s", culpritList(v.Culprits), at, waitVerb(v.Waiting), stalled)
	case len(missing) > 0:
		v.Kind = VerdictNeverEntered
		for _, rv := range missing {
			v.Culprits = append(v.Culprits, m.culprit(rv, k))
		}
		v.Summary = fmt.Sprintf("%s never entered %s; no progress for %s", culpritList(v.Culprits), at, stalled)
	default:
		v.Summary = fmt.Sprintf("every rank entered %s and none finished in %s: suspect the transport (network, NVLink, PCIe) or a GPU", at, stalled)
		for _, rv := range vs {
			if rv.c != nil && rv.c.Error != "" {
				v.Details = append(v.Details, fmt.Sprintf("rank %d: error at #%d: %s", rv.rank, rv.c.ErrorSeq, rv.c.Error))
			}
		}
	}
	for _, c := range v.Culprits {
		v.Details = append(v.Details, fmt.Sprintf("%s: %s", who(c), c.Doing))
	}
	v.Details = append(v.Details, viewNotes(vs)...)
	return v
}

// viewNotes says which ranks' collectives the detector saw only through
// NCCL RAS, and which it did not see at all.
func viewNotes(vs []rankView) []string {
	var ras []int
	var out []string
	for _, rv := range vs {
		switch {
		case rv.p == nil:
		case rv.p.CommsSource == "nccl-ras":
			ras = append(ras, rv.rank)
		case rv.p.CommsNote != "":
			out = append(out, fmt.Sprintf("no collective-level view for rank %d: %s", rv.rank, rv.p.CommsNote))
		}
	}
	if len(ras) > 0 {
		out = append([]string{fmt.Sprintf("%s seen through NCCL RAS: launch counts per function (no dtype or count), a collective counts as completed once every rank launched it",
			rankList(ras))}, out...)
	}
	return out
}

// culprit describes rank rv with respect to collective k.
func (m *Machine) culprit(rv rankView, k int64) Culprit {
	c := Culprit{Rank: rv.rank, NodeID: rv.r.nodeID, Hostname: rv.r.hostname, GPU: -1}
	if n := m.nodes[rv.r.nodeID]; n != nil && rv.r.localRank < len(n.info.GPUs) {
		c.GPU, c.GPUUUID = n.info.GPUs[rv.r.localRank].Index, n.info.GPUs[rv.r.localRank].UUID
	}
	if rv.p != nil {
		c.Pid = rv.p.Pid
	}
	state, bad := badProcess(rv)
	c.ProcState = state
	if rv.c != nil && rv.c.Pending != nil {
		p := *rv.c.Pending
		c.Collective = &p
	}
	after := fmt.Sprintf("after completing #%d", rv.completed)
	if rv.completed < k-1 {
		after = fmt.Sprintf("(its last report says #%d completed)", rv.completed)
	}
	switch {
	case state == "exited":
		how := fmt.Sprintf("exited with code %d", rv.r.exitCode)
		if rv.r.signal != "" {
			how = "was killed by " + rv.r.signal
		}
		c.Doing = fmt.Sprintf("%s %s", how, after)
	case bad && (state == "T" || state == "t"):
		c.Doing = fmt.Sprintf("is stopped (process state %s: SIGSTOP or a debugger) %s", state, after)
	case bad && state == "D":
		c.Doing = fmt.Sprintf("is in uninterruptible sleep (process state D: a driver call or I/O) %s", after)
	case bad:
		c.Doing = fmt.Sprintf("is a dead process (state %s) %s", state, after)
	case rv.p == nil:
		c.Doing = "never reported progress"
	case c.Collective != nil && c.Collective.Seq == k:
		c.Doing = fmt.Sprintf("entered %s", seqName(*c.Collective))
	case c.Collective != nil:
		c.Doing = fmt.Sprintf("waits in %s", seqName(*c.Collective))
	default:
		c.Doing = fmt.Sprintf("never entered #%d %s", k, after)
		if other := elsewhere(rv.p); other != "" {
			c.Doing += "; " + other
		} else if state != "" {
			c.Doing += fmt.Sprintf(" (process state %s: it runs other code)", state)
		}
	}
	if rv.p != nil && rv.p.Attached && !rv.p.Time.IsZero() && m.now.Sub(rv.p.Time) > 5*time.Second {
		c.Doing += fmt.Sprintf("; its last progress report is %s old", m.now.Sub(rv.p.Time).Round(time.Second))
	}
	return c
}

// elsewhere says in which other communicator's collective a rank waits.
func elsewhere(p *Progress) string {
	for _, c := range p.Comms {
		if c.Pending != nil {
			return fmt.Sprintf("it waits in %s of comm %q", seqName(*c.Pending), c.Comm)
		}
	}
	return ""
}

func seqName(c Collective) string {
	if c.Op == "" {
		return fmt.Sprintf("collective #%d", c.Seq)
	}
	s := c.Shape()
	op, rest, _ := strings.Cut(s, " ")
	return strings.TrimSpace(fmt.Sprintf("%s #%d %s", op, c.Seq, rest))
}

func who(c Culprit) string {
	s := fmt.Sprintf("rank %d", c.Rank)
	var at []string
	switch {
	case c.Pid > 0 && c.Hostname != "":
		at = append(at, fmt.Sprintf("pid %d on %s", c.Pid, c.Hostname))
	case c.Hostname != "":
		at = append(at, "on "+c.Hostname)
	}
	if c.GPU >= 0 {
		at = append(at, fmt.Sprintf("GPU %d", c.GPU))
	}
	if len(at) > 0 {
		s += " (" + strings.Join(at, ", ") + ")"
	}
	return s
}

// waitVerb is "rank 0 waits" or "ranks 0,2 wait".
func waitVerb(ranks []int) string {
	if len(ranks) == 1 {
		return rankList(ranks) + " waits"
	}
	return rankList(ranks) + " wait"
}

func culpritList(cs []Culprit) string {
	var s []string
	for _, c := range cs {
		s = append(s, who(c))
	}
	return strings.Join(s, ", ")
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

// stragglerCheck names a rank the others consistently wait for.
func (m *Machine) stragglerCheck(name string, w *commWatch, vs []rankView) []Action {
	s := &w.strag
	means := map[int]time.Duration{}
	for _, rv := range vs {
		if rv.c == nil {
			continue
		}
		ss := s.samples[rv.rank]
		if len(ss) == 0 || ss[len(ss)-1].seq != rv.c.CompletedSeq {
			ss = append(ss, waitSample{at: rv.p.Received, seq: rv.c.CompletedSeq, wait: rv.c.Wait})
		}
		for len(ss) > 2 && m.now.Sub(ss[1].at) > stragglerWindow {
			ss = ss[1:]
		}
		s.samples[rv.rank] = ss
		first, last := ss[0], ss[len(ss)-1]
		if n := last.seq - first.seq; n >= stragglerMinCollectives {
			means[rv.rank] = (last.wait - first.wait) / time.Duration(n)
		}
	}
	if len(means) < 2 || len(means) < len(vs) {
		return nil
	}
	cand, others := -1, []time.Duration{}
	for r := range vs {
		if cand < 0 || means[r] < means[cand] {
			cand = r
		}
	}
	for r := range vs {
		if r != cand {
			others = append(others, means[r])
		}
	}
	slices.Sort(others)
	gap := others[len(others)/2] - means[cand]
	switch {
	case gap >= m.cfg.StragglerThreshold:
		if cand == s.cand {
			s.streak++
		} else {
			s.cand, s.streak = cand, 1
			if s.on {
				s.on = false
				m.hang.drop(name, true)
			}
		}
	case gap < m.cfg.StragglerThreshold/2 && s.on:
		s.on, s.streak = false, 0
		m.hang.drop(name, true)
		return nil
	default:
		s.streak = 0
		return nil
	}
	if s.on || s.streak < stragglerStreak {
		return nil
	}
	s.on = true
	c := m.culprit(vs[cand], vs[cand].completed+1)
	c.Doing = fmt.Sprintf("enters collectives last: the other ranks wait %s longer per collective (median %s against its %s)",
		gap.Round(time.Millisecond), others[len(others)/2].Round(time.Millisecond), means[cand].Round(time.Millisecond))
	v := Verdict{
		Kind: VerdictStraggler, Generation: m.gen, Comm: name,
		Collective: Collective{Seq: vs[cand].completed, Root: -1},
		Since:      m.now, Culprits: []Culprit{c},
		Summary: fmt.Sprintf("%s is a straggler in comm %q: the other ranks wait %s longer per collective for it (threshold %s)",
			who(c), name, gap.Round(time.Millisecond), m.cfg.StragglerThreshold),
	}
	v.Details = []string{fmt.Sprintf("%s: %s", who(c), c.Doing)}
	return []Action{m.record(v, false)}
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

// mismatchWords is a mismatch verdict's summary without the waiting time.
func mismatchWords(v Verdict) string {
	var odd []string
	for _, c := range v.Culprits {
		if c.Collective != nil {
			odd = append(odd, fmt.Sprintf("%s called %s", who(c), c.Collective.Shape()))
		}
	}
	return fmt.Sprintf("%s where the others called %s", strings.Join(odd, "; "), v.Collective.Shape())
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

func copyVerdict(v Verdict) Verdict {
	v.Details = slices.Clone(v.Details)
	v.Waiting = slices.Clone(v.Waiting)
	v.Evidence = slices.Clone(v.Evidence)
	v.Culprits = slices.Clone(v.Culprits)
	for i, c := range v.Culprits {
		if c.Collective != nil {
			cc := *c.Collective
			v.Culprits[i].Collective = &cc
		}
	}
	return v
}
