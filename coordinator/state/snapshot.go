package state

import (
	"crypto/sha256"
	"encoding/json"
	"slices"

	"github.com/gotrain/gotrain/coordinator/job"
	"github.com/gotrain/gotrain/internal/nodehealth/policy"
)

// Compact drops, from the entries kept for a snapshot, the progress
// reports and ticks superseded by later ones of the same node (a restored
// replica's hang detector starts from the latest progress; nothing else
// depends on them), and returns the rest, in the log's order, as the log
// holds them.
func (s *State) Compact() [][]byte {
	seen := map[string]bool{}
	tick := false
	keep := make([]logged, 0, len(s.history))
	for i := len(s.history) - 1; i >= 0; i-- {
		l := s.history[i]
		switch {
		case l.progress != "" && seen[l.progress], l.tick && tick:
			continue
		case l.progress != "":
			seen[l.progress] = true
		case l.tick:
			tick = true
		}
		keep = append(keep, l)
	}
	slices.Reverse(keep)
	s.history = keep
	out := make([][]byte, len(keep))
	for i, l := range keep {
		out[i] = l.raw
	}
	return out
}

// digest is what Digest hashes: everything replicas must hold alike.
type digest struct {
	Configured bool
	Config     Config
	Status     job.Status
	Deadline   string
	NodeSeq    int
	JoinKeys   map[string]string
	Nproc      map[string]int
	Outboxes   map[string]*Outbox
	KV, Comm   map[string][]byte
	Result     *job.FinishJob
	Plan       restartPlan
	Peers      []string
	Asked      []string
	AskedHosts []string
	HostOf     map[string]string
	Beating    map[string]bool
	Health     map[string][]policy.Record `json:",omitempty"`
}

// Digest is the SHA-256 of the state: replicas that applied the same log
// hold equal digests. (Times count as instants; JSON writes maps sorted.)
func (s *State) Digest() [32]byte { return sha256.Sum256(s.digestJSON()) }

// DigestJSON is what Digest hashes (tests that find two states differ
// print it).
func (s *State) DigestJSON() []byte { return s.digestJSON() }

func (s *State) digestJSON() []byte {
	d := digest{Configured: s.configured, Config: s.cfg, Status: s.m.Status(), NodeSeq: s.nodeSeq, JoinKeys: s.joinKeys, Nproc: s.nproc,
		Outboxes: s.out, KV: s.kv.Entries(), Comm: s.comm.Entries(), Result: s.result, Plan: s.plan, Peers: s.peers, Asked: s.asked,
		AskedHosts: s.askedHosts, HostOf: s.hostOf, Beating: s.beating, Health: s.health}
	if t, ok := s.m.Deadline(); ok {
		d.Deadline = t.UTC().Format("2006-01-02T15:04:05.999999999")
	}
	b, err := json.Marshal(d)
	if err != nil {
		b = []byte(err.Error()) // a NaN rate: still alike on every replica
	}
	return b
}
