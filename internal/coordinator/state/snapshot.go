package state

import (
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/gotrain/gotrain/internal/coordinator/job"
	"github.com/gotrain/gotrain/internal/coordinator/kv"
	"github.com/gotrain/gotrain/internal/nodehealth/policy"
)

// ErrBadImage is wrapped by FromImage's error for an image no state could
// hold.
var ErrBadImage = errors.New("state: bad image")

// Image is the state's tables as plain data: what a replica's snapshot
// holds. It is the state now, not the entries that made it, so its size
// follows the job's nodes, ranks and keys, not its age.
//
// To add a table: give State its field, give Image one of the same name,
// copy it in Image and FromImage (check there whatever later code relies
// on), and add it to digest when replicas must hold it alike.
type Image struct {
	Configured bool
	Config     Config
	Machine    job.Image
	NodeSeq    int
	JoinKeys   map[string]string
	Nproc      map[string]int
	// Events are the outboxes' events, each once: an event every node gets
	// (a generation's start or end) is one value the outboxes share, here
	// as in the state, so the image grows with the nodes, not their square.
	// Outboxes list each node's events by their index in Events.
	Events   []Out
	Outboxes map[string]OutboxImage
	KV, Comm map[string][]byte
	Result   *job.FinishJob
	Plan     restartPlan
	// PlanEnded is the index in Events of the end the plan holds (the
	// outboxes' event itself, which announcing the restart completes in
	// place); -1: Plan.Ended, if any, is in no outbox.
	PlanEnded  int
	Peers      []string
	Asked      []string
	AskedHosts []string
	HostOf     map[string]string
	Beating    map[string]bool
	Applied    uint64
	// Health, Hostnames and Now: the verdicts against machines, the
	// hostnames of the nodes present, the time of the entry applied last
	// (health.go).
	Health    map[string][]policy.Record `json:",omitempty"`
	Hostnames map[string]string          `json:",omitempty"`
	Now       time.Time
}

// OutboxImage is one node's outbox: its events by index in Image.Events.
type OutboxImage struct {
	Events []int
	Closed bool
}

// shared is what makes an outbox event one value for every node that got
// it: its payload's pointer; nil for an event of one node alone.
func shared(o Out) any {
	switch {
	case o.Started != nil:
		return o.Started
	case o.Ended != nil:
		return o.Ended
	case o.Restarting != nil:
		return o.Restarting
	case o.Finished != nil:
		return o.Finished
	case o.Evidence != nil:
		return o.Evidence
	}
	return nil
}

// Image returns the state's tables. The image shares nothing with s.
func (s *State) Image() Image {
	im := Image{Configured: s.configured, Config: s.cfg, Machine: s.m.Image(), NodeSeq: s.nodeSeq, JoinKeys: maps.Clone(s.joinKeys),
		Nproc: maps.Clone(s.nproc), Outboxes: map[string]OutboxImage{}, KV: s.kv.Entries(), Comm: s.comm.Entries(), Plan: s.plan,
		PlanEnded: -1, Peers: slices.Clone(s.peers), Asked: slices.Clone(s.asked), AskedHosts: slices.Clone(s.askedHosts),
		HostOf: maps.Clone(s.hostOf), Beating: maps.Clone(s.beating), Applied: s.applied,
		Health: cloneHealth(s.health), Hostnames: maps.Clone(s.hostnames), Now: s.now}
	im.Config.Peers = slices.Clone(s.cfg.Peers)
	index := map[any]int{}
	for _, id := range s.Nodes() {
		o := s.out[id]
		ob := OutboxImage{Events: make([]int, len(o.Events)), Closed: o.Closed}
		for i, ev := range o.Events {
			key := shared(ev)
			n, ok := index[key]
			if !ok || key == nil {
				n = len(im.Events)
				ev.Seq = 0 // each outbox numbers it
				im.Events = append(im.Events, copyOut(ev))
				if key != nil {
					index[key] = n
				}
			}
			ob.Events[i] = n
		}
		im.Outboxes[id] = ob
	}
	if s.result != nil {
		r := *s.result
		im.Result = &r
	}
	if s.plan.Ended != nil {
		if n, ok := index[s.plan.Ended]; ok {
			im.Plan.Ended, im.PlanEnded = nil, n
		} else {
			e := *s.plan.Ended
			im.Plan.Ended = &e
		}
	}
	return im
}

// FromImage returns the state im holds. An image comes from another
// process (a replica's snapshot): what later entries rely on is checked
// (every event an outbox names exists; the stores' bounds; the machine's
// own checks), and a breach is an error wrapping ErrBadImage.
func FromImage(im Image) (*State, error) {
	bad := func(format string, args ...any) (*State, error) {
		return nil, fmt.Errorf("%w: %s", ErrBadImage, fmt.Sprintf(format, args...))
	}
	m, err := job.FromImage(im.Machine)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadImage, err)
	}
	s := &State{cfg: im.Config, configured: im.Configured, m: m, nodeSeq: im.NodeSeq, joinKeys: orEmpty(im.JoinKeys), nproc: orEmpty(im.Nproc),
		out: map[string]*Outbox{}, kv: kv.New(), comm: kv.New(), plan: im.Plan, peers: slices.Clone(im.Peers), asked: slices.Clone(im.Asked),
		askedHosts: slices.Clone(im.AskedHosts), hostOf: orEmpty(im.HostOf), beating: orEmpty(im.Beating), applied: im.Applied,
		health: cloneHealth(im.Health), hostnames: orEmpty(im.Hostnames), now: im.Now}
	if im.NodeSeq < 0 {
		return bad("node sequence %d", im.NodeSeq)
	}
	if err := checkHealth(im.Health); err != nil {
		return bad("%v", err)
	}
	s.cfg.Peers = slices.Clone(im.Config.Peers)
	events := make([]Out, len(im.Events)) // one value each, which the outboxes share
	for i, ev := range im.Events {
		if ev.Seq != 0 || shared(ev) == nil && ev.Replicas == nil && !ev.HostReplica {
			return bad("event %d: numbered %d, or empty", i, ev.Seq)
		}
		events[i] = copyOut(ev)
	}
	for id, o := range im.Outboxes {
		box := &Outbox{Closed: o.Closed}
		if len(o.Events) > 0 { // a new outbox's are nil, as Digest sees
			box.Events = make([]Out, len(o.Events))
		}
		for i, n := range o.Events {
			if n < 0 || n >= len(events) {
				return bad("node %s: event %d is #%d of %d", id, i+1, n, len(events))
			}
			box.Events[i] = events[n]
			box.Events[i].Seq = uint64(i + 1)
		}
		s.out[id] = box
	}
	for _, st := range []struct {
		name string
		to   *kv.Store
		from map[string][]byte
	}{{"key-value", s.kv, im.KV}, {"rendezvous", s.comm, im.Comm}} {
		for _, k := range slices.Sorted(maps.Keys(st.from)) {
			if err := st.to.Put(k, st.from[k]); err != nil {
				return bad("the %s store: %v", st.name, err)
			}
		}
	}
	if im.Result != nil {
		r := *im.Result
		s.result = &r
	}
	switch {
	case im.PlanEnded >= 0 && (im.PlanEnded >= len(events) || events[im.PlanEnded].Ended == nil || im.Plan.Ended != nil):
		return bad("the restart plan's end: event %d of %d, not an end (or a second one)", im.PlanEnded, len(events))
	case im.PlanEnded >= 0:
		s.plan.Ended = events[im.PlanEnded].Ended
	case im.Plan.Ended != nil:
		e := *im.Plan.Ended
		s.plan.Ended = &e
	}
	return s, nil
}

// copyOut is o with payloads of its own (a Restart, EvidenceRequest or
// end may be completed in place later; the others are never changed).
func copyOut(o Out) Out {
	c := o
	c.Replicas = slices.Clone(o.Replicas)
	if o.Started != nil {
		v := *o.Started
		c.Started = &v
	}
	if o.Ended != nil {
		v := *o.Ended
		c.Ended = &v
	}
	if o.Restarting != nil {
		v := *o.Restarting
		c.Restarting = &v
	}
	if o.Finished != nil {
		v := *o.Finished
		c.Finished = &v
	}
	if o.Evidence != nil {
		v := *o.Evidence
		c.Evidence = &v
	}
	return c
}

func orEmpty[K comparable, V any](m map[K]V) map[K]V {
	if m == nil {
		return map[K]V{}
	}
	return maps.Clone(m)
}

// Digest is the SHA-256 of the state: replicas that applied the same log
// hold equal digests. It hashes the image (every table, the job machine's
// inner state included, each outbox event once; JSON writes maps sorted).
func (s *State) Digest() [32]byte { return sha256.Sum256(s.digestJSON()) }

// DigestJSON is what Digest hashes (tests that find two states differ
// print it).
func (s *State) DigestJSON() []byte { return s.digestJSON() }

func (s *State) digestJSON() []byte {
	b, err := json.Marshal(s.Image())
	if err != nil {
		b = []byte(err.Error()) // alike on every replica
	}
	return b
}

// cloneHealth is h with slices of its own; nil stays nil (the state
// starts without records).
func cloneHealth(h map[string][]policy.Record) map[string][]policy.Record {
	if h == nil {
		return nil
	}
	c := make(map[string][]policy.Record, len(h))
	for host, recs := range h {
		c[host] = slices.Clone(recs)
	}
	return c
}

// checkHealth holds an image's records to the bounds the state keeps them
// in (health.go).
func checkHealth(h map[string][]policy.Record) error {
	if len(h) > maxHealthHosts {
		return fmt.Errorf("health records of %d hosts, at most %d", len(h), maxHealthHosts)
	}
	for host, recs := range h {
		if len(recs) > maxHealthPerHost {
			return fmt.Errorf("host %q: %d health records, at most %d", Truncate(host, 64), len(recs), maxHealthPerHost)
		}
		for _, r := range recs {
			if len(r.Check) > maxHealthText || len(r.Detail) > maxHealthText {
				return fmt.Errorf("host %q: a health record longer than %d bytes", Truncate(host, 64), maxHealthText)
			}
		}
	}
	return nil
}
