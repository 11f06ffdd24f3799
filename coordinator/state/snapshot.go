package state

import (
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/gotrain/gotrain/coordinator/job"
	"github.com/gotrain/gotrain/coordinator/kv"
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
	Outboxes   map[string]*Outbox
	KV, Comm   map[string][]byte
	Result     *job.FinishJob
	Plan       restartPlan
	Peers      []string
	Asked      []string
	AskedHosts []string
	HostOf     map[string]string
	Beating    map[string]bool
	Applied    uint64
}

// Image returns the state's tables. The image shares nothing with s.
func (s *State) Image() Image {
	im := Image{Configured: s.configured, Config: s.cfg, Machine: s.m.Image(), NodeSeq: s.nodeSeq, JoinKeys: maps.Clone(s.joinKeys),
		Nproc: maps.Clone(s.nproc), Outboxes: map[string]*Outbox{}, KV: s.kv.Entries(), Comm: s.comm.Entries(), Plan: s.plan,
		Peers: slices.Clone(s.peers), Asked: slices.Clone(s.asked), AskedHosts: slices.Clone(s.askedHosts), HostOf: maps.Clone(s.hostOf),
		Beating: maps.Clone(s.beating), Applied: s.applied}
	im.Config.Peers = slices.Clone(s.cfg.Peers)
	for id, o := range s.out {
		im.Outboxes[id] = &Outbox{Events: slices.Clone(o.Events), Closed: o.Closed}
	}
	if s.result != nil {
		r := *s.result
		im.Result = &r
	}
	if s.plan.Ended != nil {
		e := *s.plan.Ended
		im.Plan.Ended = &e
	}
	return im
}

// FromImage returns the state im holds. An image comes from another
// process (a replica's snapshot): what later entries rely on is checked
// (outboxes numbered 1, 2, ...; the stores' bounds; the machine's own
// checks), and a breach is an error wrapping ErrBadImage.
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
		askedHosts: slices.Clone(im.AskedHosts), hostOf: orEmpty(im.HostOf), beating: orEmpty(im.Beating), applied: im.Applied}
	if im.NodeSeq < 0 {
		return bad("node sequence %d", im.NodeSeq)
	}
	s.cfg.Peers = slices.Clone(im.Config.Peers)
	for id, o := range im.Outboxes {
		if o == nil {
			return bad("node %s: no outbox", id)
		}
		for i, ev := range o.Events {
			if ev.Seq != uint64(i+1) {
				return bad("node %s: event %d numbered %d", id, i+1, ev.Seq)
			}
		}
		s.out[id] = &Outbox{Events: slices.Clone(o.Events), Closed: o.Closed}
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
	if im.Plan.Ended != nil {
		e := *im.Plan.Ended
		s.plan.Ended = &e
	}
	return s, nil
}

func orEmpty[K comparable, V any](m map[K]V) map[K]V {
	if m == nil {
		return map[K]V{}
	}
	return maps.Clone(m)
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
		AskedHosts: s.askedHosts, HostOf: s.hostOf, Beating: s.beating}
	if t, ok := s.m.Deadline(); ok {
		d.Deadline = t.UTC().Format("2006-01-02T15:04:05.999999999")
	}
	b, err := json.Marshal(d)
	if err != nil {
		b = []byte(err.Error()) // a NaN rate: still alike on every replica
	}
	return b
}
