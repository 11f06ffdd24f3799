package job

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/gotrain/gotrain/internal/coordinator/rhythm"
)

// ErrBadImage is wrapped by FromImage's error for an image no machine
// could hold.
var ErrBadImage = errors.New("job: bad machine image")

// Image is a machine's state as plain data: what a replica's snapshot
// holds of the job, so that a restored machine steps as the original
// would. Every field of Machine has its field here (a field added to
// Machine is added here, to Image and to FromImage).
type Image struct {
	Cfg      Config
	State    State
	Nodes    []NodeImage
	Gen      int64
	Restarts int
	Ranks    []RankImage
	Failure  *Failure
	Reason   string
	// Barriers: name -> rank -> waiting calls.
	Barriers       map[string]map[int][]uint64
	Released       map[string]bool
	Waiters        map[uint64]string
	Now            time.Time
	WaitingSince   time.Time
	PendingRestart bool
	RestartAt      time.Time
	Hang           HangImage
	Repeats        RepeatsImage
	Members        MembersImage
	Straggle       StraggleImage
	Joins          int
}

// NodeImage is one node present.
type NodeImage struct {
	ID               string
	Info             NodeInfo
	GroupRank        int
	Host             bool
	NodeRank         int
	Seq              int
	UnreachableSince time.Time
	UnreachableWhy   string
	Attached         bool
	JoinedAt         time.Time
}

// RankImage is one rank of the current generation.
type RankImage struct {
	NodeID    string
	Hostname  string
	LocalRank int
	State     RankState
	ExitCode  int
	Signal    string
	Progress  *Progress
}

// HangImage is the hang detector's state.
type HangImage struct {
	Gen        int64
	Comms      map[string]CommWatchImage
	Paces      map[string]rhythm.PaceImage
	Verdicts   []Verdict
	NextID     int64
	PostMortem bool
}

// CommWatchImage is one communicator's watch.
type CommWatchImage struct {
	Min        int64
	MinSet     bool
	ProgressAt time.Time
	Fired      bool
	Judge      rhythm.JudgeImage
}

// RepeatsImage is the count of failures that repeat without progress.
type RepeatsImage struct {
	Gen       int64
	Moved     bool
	FirstStep map[int]int64
	Count     int
	Last      SignatureImage
	Counted   int64
}

// SignatureImage is a failure's signature.
type SignatureImage struct {
	ExitCode  int
	Signal    string
	Reason    string
	OOMKilled bool
}

// MembersImage is the membership's deadlines.
type MembersImage struct {
	ActAt   time.Time
	Growing bool
	EndedAt time.Time
}

// StraggleImage is the replacement of stragglers.
type StraggleImage struct {
	Replacing bool
	Last      *ReplacementImage
	Unhelped  map[int64]bool
}

// ReplacementImage is a straggler replaced.
type ReplacementImage struct {
	Rank int
	Host string
	At   time.Time
}

// Image returns m's state. The image shares nothing with m.
func (m *Machine) Image() Image {
	im := Image{Cfg: m.cfg, State: m.state, Gen: m.gen, Restarts: m.restarts, Reason: m.reason,
		Barriers: map[string]map[int][]uint64{}, Released: maps.Clone(m.released), Waiters: maps.Clone(m.waiters),
		Now: m.now, WaitingSince: m.waitingSince, PendingRestart: m.pendingRestart, RestartAt: m.restartAt, Joins: m.joins}
	for _, id := range slices.Sorted(maps.Keys(m.nodes)) {
		n := m.nodes[id]
		im.Nodes = append(im.Nodes, NodeImage{ID: n.id, Info: n.info, GroupRank: n.groupRank, Host: n.host, NodeRank: n.nodeRank, Seq: n.seq,
			UnreachableSince: n.unreachableSince, UnreachableWhy: n.unreachableWhy, Attached: n.attached, JoinedAt: n.joinedAt})
	}
	for _, r := range m.ranks {
		ri := RankImage{NodeID: r.nodeID, Hostname: r.hostname, LocalRank: r.localRank, State: r.state, ExitCode: r.exitCode, Signal: r.signal}
		if r.progress != nil {
			p := *r.progress
			ri.Progress = &p
		}
		im.Ranks = append(im.Ranks, ri)
	}
	if m.failure != nil {
		f := *m.failure
		im.Failure = &f
	}
	for name, b := range m.barriers {
		arrived := map[int][]uint64{}
		for r, ws := range b.arrived {
			arrived[r] = slices.Clone(ws)
		}
		im.Barriers[name] = arrived
	}
	h := m.hang
	im.Hang = HangImage{Gen: h.gen, Comms: map[string]CommWatchImage{}, Paces: map[string]rhythm.PaceImage{}, Verdicts: slices.Clone(h.verdicts),
		NextID: h.nextID, PostMortem: h.postMortem}
	if h.comms == nil {
		im.Hang.Comms = nil // the detector resets a nil table: keep it nil
	}
	if h.paces == nil {
		im.Hang.Paces = nil
	}
	for name, w := range h.comms {
		im.Hang.Comms[name] = CommWatchImage{Min: w.min, MinSet: w.minSet, ProgressAt: w.progressAt, Fired: w.fired, Judge: w.judge.Image()}
	}
	for name, p := range h.paces {
		im.Hang.Paces[name] = p.Image()
	}
	r := m.repeats
	im.Repeats = RepeatsImage{Gen: r.gen, Moved: r.moved, FirstStep: maps.Clone(r.firstStep), Count: r.count, Counted: r.counted,
		Last: SignatureImage{ExitCode: r.last.exitCode, Signal: r.last.signal, Reason: r.last.reason, OOMKilled: r.last.oomKilled}}
	im.Members = MembersImage{ActAt: m.members.actAt, Growing: m.members.growing, EndedAt: m.members.endedAt}
	im.Straggle = StraggleImage{Replacing: m.straggle.replacing, Unhelped: maps.Clone(m.straggle.unhelped)}
	if l := m.straggle.last; l != nil {
		im.Straggle.Last = &ReplacementImage{Rank: l.rank, Host: l.host, At: l.at}
	}
	return im
}

// FromImage returns the machine im holds. An image is input from another
// process (a replica's snapshot): one that breaks what Step relies on (a
// rank on no node, a state it does not know, a configuration New refuses)
// is an error wrapping ErrBadImage, never a machine that panics later.
func FromImage(im Image) (*Machine, error) {
	m, err := New(im.Cfg)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadImage, err)
	}
	bad := func(format string, args ...any) (*Machine, error) {
		return nil, fmt.Errorf("%w: %s", ErrBadImage, fmt.Sprintf(format, args...))
	}
	switch im.State {
	case StateWaiting, StateRunning, StateRestarting, StateSucceeded, StateFailed:
	default:
		return bad("job state %q", im.State)
	}
	if im.Gen < -1 || im.Restarts < 0 || im.Joins < 0 {
		return bad("generation %d, restarts %d, joins %d", im.Gen, im.Restarts, im.Joins)
	}
	m.state, m.gen, m.restarts, m.reason, m.joins = im.State, im.Gen, im.Restarts, im.Reason, im.Joins
	m.now, m.waitingSince, m.pendingRestart, m.restartAt = im.Now, im.WaitingSince, im.PendingRestart, im.RestartAt
	for _, n := range im.Nodes {
		if n.ID == "" || m.nodes[n.ID] != nil {
			return bad("node id %q empty or repeated", n.ID)
		}
		m.nodes[n.ID] = &node{id: n.ID, info: n.Info, groupRank: n.GroupRank, host: n.Host, nodeRank: n.NodeRank, seq: n.Seq,
			unreachableSince: n.UnreachableSince, unreachableWhy: n.UnreachableWhy, attached: n.Attached, joinedAt: n.JoinedAt}
	}
	for i, r := range im.Ranks {
		switch r.State {
		case RankRunning, RankExited, RankFailed, RankStopped, RankLost, RankParked:
		default:
			return bad("rank %d: state %q", i, r.State)
		}
		rk := rank{nodeID: r.NodeID, hostname: r.Hostname, localRank: r.LocalRank, state: r.State, exitCode: r.ExitCode, signal: r.Signal}
		if r.Progress != nil {
			p := *r.Progress
			rk.progress = &p
		}
		m.ranks = append(m.ranks, rk)
	}
	if im.Failure != nil {
		f := *im.Failure
		m.failure = &f
	}
	for name, arrived := range im.Barriers {
		b := &barrier{arrived: map[int][]uint64{}}
		for r, ws := range arrived {
			if r < 0 || r >= len(m.ranks) {
				return bad("barrier %q: rank %d of %d", name, r, len(m.ranks))
			}
			b.arrived[r] = slices.Clone(ws)
		}
		m.barriers[name] = b
	}
	maps.Copy(m.released, im.Released)
	maps.Copy(m.waiters, im.Waiters)
	h := &m.hang
	h.gen, h.verdicts, h.nextID, h.postMortem = im.Hang.Gen, slices.Clone(im.Hang.Verdicts), im.Hang.NextID, im.Hang.PostMortem
	if im.Hang.Comms != nil {
		h.comms = map[string]*commWatch{}
	}
	for name, w := range im.Hang.Comms {
		j, err := rhythm.JudgeFromImage(w.Judge)
		if err != nil {
			return bad("communicator %q: %v", name, err)
		}
		h.comms[name] = &commWatch{min: w.Min, minSet: w.MinSet, progressAt: w.ProgressAt, fired: w.Fired, judge: j}
	}
	if im.Hang.Paces != nil || h.comms != nil { // pace() adds to it once comms is set
		h.paces = map[string]*rhythm.Pace{}
	}
	for name, pi := range im.Hang.Paces {
		p, err := rhythm.PaceFromImage(pi)
		if err != nil {
			return bad("communicator %q: %v", name, err)
		}
		h.paces[name] = p
	}
	r := im.Repeats
	m.repeats = repeats{gen: r.Gen, moved: r.Moved, firstStep: maps.Clone(r.FirstStep), count: r.Count, counted: r.Counted,
		last: failureSignature{exitCode: r.Last.ExitCode, signal: r.Last.Signal, reason: r.Last.Reason, oomKilled: r.Last.OOMKilled}}
	m.members = membership{actAt: im.Members.ActAt, growing: im.Members.Growing, endedAt: im.Members.EndedAt}
	m.straggle = straggle{replacing: im.Straggle.Replacing, unhelped: maps.Clone(im.Straggle.Unhelped)}
	if l := im.Straggle.Last; l != nil {
		m.straggle.last = &replacement{rank: l.Rank, host: l.Host, at: l.At}
	}
	return m, nil
}
