// Straggler mitigation: a straggler
// verdict (hang_straggler.go) that has stood for StragglerPersist replaces
// its rank.
//
//   - Under --nnodes MIN:MAX with more than MIN nodes, the straggler's node
//     is dropped (DropNode, then the node is lost): the job goes on on the
//     others, as after a lost node. Never the node whose agent runs the
//     coordinator: dropping it would stop the job's coordinator.
//   - Otherwise the generation ends through the failure path, naming the
//     straggler (Failure.Reason "straggler: ..."), with the rank in
//     EndGeneration.Replace: its agent stops that process even when it
//     recovers in process, and the next generation starts it afresh, on a
//     ready standby when there is one (internal/launcher/relay/standby.go).
//
// A replacement is not a failure and does not count against MaxRestarts
// (like a growth): the user asked for it, and counting it would let a slow
// GPU spend the restarts kept for crashes, or, with --max-restarts 0, turn
// a job that merely runs slowly into a failed one. What bounds it instead is
// the cool-down: a straggler named on the replaced rank, or on a rank of
// the same host, within StragglerCooldown of a replacement is only
// reported — the new process is as slow as the old, so the cause is likely
// the GPU or the host, and replacing again would only cost another restart.
// Its verdict says so, and the job keeps running.

package job

import (
	"fmt"
	"time"
)

// What the machine does with a persistent straggler (Config.OnStraggler).
const (
	// OnStragglerReport reports the verdict and changes nothing.
	OnStragglerReport = "report"
	// OnStragglerReplace replaces the straggler's rank (or drops its node).
	OnStragglerReplace = "replace"
)

// Defaults of Config.
const (
	// DefaultStragglerPersist: the judge names a rank only after three
	// judgements in a row over a 5 s window, so a verdict that stands 30 s
	// more is a rank slow for most of a minute: longer than a checkpoint
	// write, a data-loader stall or a garbage collection, which pass by
	// themselves, and about what a replacement costs (every rank restarts
	// from its last checkpoint), so only a slowdown that has already lasted
	// that long is likely to be worth it.
	DefaultStragglerPersist = 30 * time.Second
	// DefaultStragglerCooldown: a straggler back on the same rank or host
	// within 10 minutes of its replacement is the hardware, not the
	// process; after that long, it may be a new slowdown, worth a new try.
	DefaultStragglerCooldown = 10 * time.Minute
)

// straggle is what the machine remembers of replacements.
type straggle struct {
	// replacing: the running generation ended to replace a straggler; the
	// next one starts without counting a restart (afterEnd).
	replacing bool
	last      *replacement // the latest replacement
	// unhelped holds the straggler verdicts already reported as not helped
	// by the latest replacement, by id.
	unhelped map[int64]bool
}

// replacement is a straggler replaced: its rank, host, and when.
type replacement struct {
	rank int
	host string
	at   time.Time
}

// recent says whether c is on the rank or the host of a replacement less
// than cooldown before now.
func (s *straggle) recent(c Culprit, now time.Time, cooldown time.Duration) bool {
	l := s.last
	return l != nil && now.Sub(l.at) < cooldown && (c.Rank == l.rank || (c.Hostname != "" && c.Hostname == l.host))
}

// replaceTick acts on a straggler verdict that has stood for
// StragglerPersist, under OnStragglerReplace. It runs on every Tick, after
// the straggler checks.
func (m *Machine) replaceTick() []Action {
	if m.cfg.OnStraggler != OnStragglerReplace || m.state != StateRunning {
		return nil
	}
	for _, v := range m.hang.verdicts {
		if v.Kind != VerdictStraggler || len(v.Culprits) == 0 || m.now.Sub(v.Since) < m.cfg.StragglerPersist {
			continue
		}
		c := v.Culprits[0]
		if c.Rank < 0 || c.Rank >= len(m.ranks) || m.ranks[c.Rank].state != RankRunning {
			continue
		}
		if m.straggle.recent(c, m.now, m.cfg.StragglerCooldown) {
			if m.straggle.unhelped[v.ID] {
				continue // said so already
			}
			return []Action{m.notHelped(copyVerdict(v))}
		}
		return m.replace(v, c)
	}
	return nil
}

// notHelped reports verdict v again, saying that replacing its rank (or a
// rank of its host) did not help and that it is not replaced again.
func (m *Machine) notHelped(v Verdict) Action {
	l := m.straggle.last
	note := fmt.Sprintf("replacing rank %d on host %s %s ago did not help, so it is not replaced again: the cause is likely the GPU or the host (check its clocks, temperature and other load; --on-straggler replace waits %s after a replacement)",
		l.rank, l.host, m.now.Sub(l.at).Round(time.Second), m.cfg.StragglerCooldown)
	v.Summary += "; " + note
	v.Details = append(v.Details, note)
	m.hang.drop(v.Comm, true)
	a := m.record(v, false)
	if m.straggle.unhelped == nil {
		m.straggle.unhelped = map[int64]bool{}
	}
	m.straggle.unhelped[m.hang.nextID] = true // record's id
	return a
}

// replace replaces straggler c of verdict v: drops its node when the job
// can go on without it, else ends the generation so that its agent starts
// the rank afresh.
func (m *Machine) replace(v Verdict, c Culprit) []Action {
	stood := m.now.Sub(v.Since).Round(time.Second)
	m.straggle.last = &replacement{rank: c.Rank, host: c.Hostname, at: m.now}
	m.straggle.replacing = true
	if n := m.nodes[c.NodeID]; n != nil && !n.host && m.placed() > m.cfg.MinNodes {
		return m.dropStraggler(n, c, v, stood)
	}
	f := &Failure{Rank: c.Rank, NodeID: c.NodeID, Hostname: c.Hostname, Pid: c.Pid, Reason: "straggler: " + v.Summary}
	desc := fmt.Sprintf("replacing %s, the straggler for %s (--on-straggler replace): %s", whereRank(c), stood, v.Summary)
	return append(m.endReplacing(f, desc, []int{c.Rank}), m.afterEnd()...)
}

// dropStraggler drops node n, which holds straggler c, from the job: its
// agent is told why, and the job goes on on the others (a lost node).
func (m *Machine) dropStraggler(n *node, c Culprit, v Verdict, stood time.Duration) []Action {
	why := fmt.Sprintf("rank %d on host %s dropped as a persistent straggler (the straggler for %s, --on-straggler replace): %s; the job goes on on its other %s (--nnodes %s)",
		c.Rank, n.info.Hostname, stood, v.Summary, plural(m.placed()-1, "node"), m.nnodes())
	var ranks []int
	for r := range m.ranks {
		if m.ranks[r].nodeID == n.id {
			ranks = append(ranks, r)
		}
	}
	acts := []Action{DropNode{NodeID: n.id, Hostname: n.info.Hostname, Reason: why, Straggler: true}}
	lost, err := m.lost(NodeLost{NodeID: n.id, Reason: "straggler: " + why})
	if err != nil {
		return nil // cannot happen: n is a node of the job
	}
	for i, a := range lost {
		if e, ok := a.(EndGeneration); ok {
			e.Replace = ranks // its agents say why the generation ended
			lost[i] = e
		}
	}
	return append(acts, lost...)
}
