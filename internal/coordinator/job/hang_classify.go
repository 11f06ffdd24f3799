// Classification: why a stalled communicator is stuck (process, mismatch,
// never entered, stuck) and which ranks are the culprits.

package job

import (
	"fmt"
	"strings"
	"time"
)

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
	k := stuckAt(vs)
	v := Verdict{Kind: VerdictStuck, Generation: m.gen, Comm: name, Since: since, Detected: m.now}
	var missing []rankView
	g := pendingGroups{ranks: map[string][]int{}, shapes: map[string]Collective{}}
	for _, rv := range vs {
		if rv.entered < k {
			missing = append(missing, rv)
			continue
		}
		v.Waiting = append(v.Waiting, rv.rank)
		if p := rv.c.Pending; p != nil && p.Seq == k {
			g.add(p, rv.rank)
		}
	}
	major := g.majority()
	v.Collective = Collective{Seq: k, Root: -1}
	if major != "" {
		v.Collective = g.shapes[major]
		v.Collective.Seq = k
	}
	stalled := m.now.Sub(since).Round(100 * time.Millisecond)
	at := fmt.Sprintf("%s of comm %q", seqName(v.Collective), name)

	var bad []rankView
	if !postMortem {
		bad = badProcesses(vs)
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
	case len(g.ranks) > 1:
		v.Kind = VerdictMismatch
		var odd []string
		v.Culprits, odd = m.mismatched(vs, k, g, major)
		v.Summary = fmt.Sprintf("mismatch at #%d of comm %q: %s where %s called %s; waiting for %s",
			k, name, strings.Join(odd, "; "), rankList(g.ranks[major]), g.shapes[major].Shape(), stalled)
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
		v.Details = append(v.Details, collectiveErrors(vs)...)
	}
	for _, c := range v.Culprits {
		v.Details = append(v.Details, fmt.Sprintf("%s: %s", who(c), c.Doing))
	}
	v.Details = append(v.Details, viewNotes(vs)...)
	return v
}

// stuckAt returns the collective the job is stuck at: the lowest one a
// rank entered and did not complete, else the one after the lowest
// completed. The job is stuck where the pending ranks wait; a rank whose
// last report is older (a stopped process cannot report) may show less.
func stuckAt(vs []rankView) int64 {
	low, _ := lowest(vs)
	k := low + 1
	first := true
	for _, rv := range vs {
		if rv.entered > rv.completed && (first || rv.completed+1 < k) {
			k, first = rv.completed+1, false
		}
	}
	return k
}

// pendingGroups are the ranks pending in one collective, grouped by the
// signature of the call each made.
type pendingGroups struct {
	ranks  map[string][]int
	order  []string // signatures in rank order of first appearance
	shapes map[string]Collective
}

func (g *pendingGroups) add(p *Collective, rank int) {
	sig := p.signature()
	if _, ok := g.ranks[sig]; !ok {
		g.order = append(g.order, sig)
		g.shapes[sig] = *p
	}
	g.ranks[sig] = append(g.ranks[sig], rank)
}

// majority returns the signature of the largest group, "" when there is
// none. The majority's collective is the one the job is at; ties go to the
// group of the lowest rank.
func (g *pendingGroups) majority() string {
	major := ""
	for _, sig := range g.order {
		if major == "" || len(g.ranks[sig]) > len(g.ranks[major]) {
			major = sig
		}
	}
	return major
}

// badProcesses returns the ranks whose process cannot make progress.
func badProcesses(vs []rankView) []rankView {
	var bad []rankView
	for _, rv := range vs {
		if _, ok := badProcess(rv); ok {
			bad = append(bad, rv)
		}
	}
	return bad
}

// mismatched returns the culprits of a mismatch at collective k, the ranks
// outside the majority group major, and what each other group called.
func (m *Machine) mismatched(vs []rankView, k int64, g pendingGroups, major string) (culprits []Culprit, odd []string) {
	for _, sig := range g.order {
		if sig == major {
			continue
		}
		for _, r := range g.ranks[sig] {
			culprits = append(culprits, m.culprit(vs[r], k))
		}
		odd = append(odd, fmt.Sprintf("%s called %s", rankList(g.ranks[sig]), g.shapes[sig].Shape()))
	}
	return culprits, odd
}

// collectiveErrors lists the errors the ranks' communicators reported.
func collectiveErrors(vs []rankView) []string {
	var out []string
	for _, rv := range vs {
		if rv.c != nil && rv.c.Error != "" {
			out = append(out, fmt.Sprintf("rank %d: error at #%d: %s", rv.rank, rv.c.ErrorSeq, rv.c.Error))
		}
	}
	return out
}

// viewNotes says which ranks' collectives the detector saw only from
// outside the program (NCCL RAS, the PyTorch hook), and which it did not
// see at all.
func viewNotes(vs []rankView) []string {
	var ras, hook []int
	var out []string
	for _, rv := range vs {
		switch {
		case rv.p == nil:
		case rv.p.CommsSource == "nccl-ras":
			ras = append(ras, rv.rank)
		case rv.p.CommsSource == "torch-hook":
			hook = append(hook, rv.rank)
		case rv.p.CommsNote != "":
			out = append(out, fmt.Sprintf("no collective-level view for rank %d: %s", rv.rank, rv.p.CommsNote))
		}
	}
	var seen []string
	if len(ras) > 0 {
		seen = append(seen, fmt.Sprintf("%s seen through NCCL RAS: launch counts per function (no dtype or count), a collective counts as completed once every rank launched it",
			rankList(ras)))
	}
	if len(hook) > 0 {
		seen = append(seen, fmt.Sprintf("%s seen through gotrain's PyTorch hook: the gloo default group's collectives by function (no dtype or count)", rankList(hook)))
	}
	return append(seen, out...)
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
