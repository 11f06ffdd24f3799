package state

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/gotrain/gotrain/internal/coordinator/job"
	"github.com/gotrain/gotrain/internal/nodehealth/policy"
)

// The node-health ledger of the replicated state: the verdicts this job's
// coordinator saw against machines (by hostname) — a node lost, a
// straggler dropped, a node that failed its preflight or the gang check —
// so that an elastic job does not admit again, for the policy's cool-off,
// a machine that failed twice within its window. Every record comes from
// an entry of the log, at that entry's time: replicas, and a replica
// restored by replaying a snapshot's entries, hold the same records.

// Bounds: a fixed number of hosts, each with its latest records.
const (
	maxHealthPerHost = 8
	maxHealthHosts   = 1024
	// maxHealthText bounds a record's check and detail.
	maxHealthText = 256
)

// HealthPolicy is the policy the coordinator decides with: the agents'
// own (their local ledger) is the same.
var HealthPolicy = policy.DefaultPolicy

// GangVerdictKey says whether key is where the leader of the preflight gang
// check puts its verdict (package internal/preflight, gangrun.go), and of
// which generation.
func GangVerdictKey(key string) (gen int64, ok bool) {
	rest, found := strings.CutPrefix(key, "preflight/gang/")
	if !found {
		return 0, false
	}
	g, tail, found := strings.Cut(rest, "/")
	if !found || tail != "verdict" {
		return 0, false
	}
	gen, err := strconv.ParseInt(g, 10, 64)
	return gen, err == nil && gen >= 0
}

// gangVerdict is what the state reads of the gang's verdict (the JSON of
// preflight.GangVerdict; health_test.go checks the two agree): which nodes
// are out, and why. Node ids are checked against the nodes present, and
// the machine is named by the hostname the node joined with, never by the
// verdict's text.
type gangVerdict struct {
	Out []struct {
		Check    string `json:"check"`
		Measured string `json:"measured"`
		Expected string `json:"expected"`
	} `json:"out"`
	OutIDs []string `json:"out_ids"`
}

// HealthRecords are the records of host, oldest first.
func (s *State) HealthRecords(host string) []policy.Record { return slices.Clone(s.health[host]) }

// record keeps a verdict against host at now.
func (s *State) record(now time.Time, host string, kind policy.Kind, check, detail string) {
	if host == "" {
		return
	}
	if s.health == nil {
		s.health = map[string][]policy.Record{}
	}
	recs, known := s.health[host]
	if !known && len(s.health) >= maxHealthHosts {
		s.evictHealth()
	}
	recs = append(recs, policy.Record{Time: now, Host: host, Kind: kind, Check: Truncate(check, maxHealthText),
		Detail: Truncate(detail, maxHealthText), RunID: s.m.Config().RunID})
	if len(recs) > maxHealthPerHost {
		recs = slices.Delete(recs, 0, len(recs)-maxHealthPerHost)
	}
	s.health[host] = recs
	if kind.Counts() { // a loss is logged as such already
		s.log(LevelInfo, "node health", "hostname", host, "kind", string(kind), "check", check)
	}
}

// evictHealth drops the host whose latest record is the oldest (ties: the
// first by name, so that every replica drops the same).
func (s *State) evictHealth() {
	var victim string
	var oldest time.Time
	for _, h := range slices.Sorted(maps.Keys(s.health)) {
		recs := s.health[h]
		last := recs[len(recs)-1].Time
		if victim == "" || last.Before(oldest) {
			victim, oldest = h, last
		}
	}
	delete(s.health, victim)
}

// recordGang keeps the gang check's verdict against the nodes it put out,
// when key is the verdict's.
func (s *State) recordGang(now time.Time, key string, value []byte) {
	if _, ok := GangVerdictKey(key); !ok {
		return
	}
	var v gangVerdict
	if json.Unmarshal(value, &v) != nil || len(v.Out) != len(v.OutIDs) {
		s.log(LevelWarn, "node health: the gang check's verdict is not one; not kept", "key", key)
		return
	}
	for i, id := range v.OutIDs {
		host := s.m.NodeHostname(id)
		if host == "" {
			continue // not a node of this job
		}
		o := v.Out[i]
		s.record(now, host, policy.Preflight, o.Check, fmt.Sprintf("gang check: %s (expected %s)", o.Measured, o.Expected))
	}
}

// elastic: the job goes on without a node (--nnodes MIN:MAX).
func (s *State) elastic() bool {
	c := s.m.Config()
	return c.MinNodes > 0 && c.MinNodes < c.Nodes
}

// coolingOff refuses the join of a machine that the policy keeps out of
// elastic jobs at now; nil when it may join (or the job is not elastic:
// then it needs every node, and a refusal would only fail it).
func (s *State) coolingOff(now time.Time, j Join) error {
	host := j.Node.Hostname
	if !s.elastic() || j.Host || now.IsZero() {
		return nil
	}
	d := policy.Decide(s.health[host], host, now, HealthPolicy)
	if d.Admit {
		return nil
	}
	var why []string
	for _, r := range d.Because {
		w := string(r.Kind)
		if r.Check != "" {
			w += " " + r.Check
		}
		why = append(why, fmt.Sprintf("%s at %s", w, r.Time.UTC().Format(time.RFC3339)))
	}
	msg := fmt.Sprintf("%s: machine %s failed %d times within %s in this job (%s); it may join again from %s (--nnodes MIN:MAX goes on without it)",
		job.ErrCoolingOff, Truncate(host, 64), len(d.Because), HealthPolicy.Window, strings.Join(why, "; "), d.Until.UTC().Format(time.RFC3339))
	return &Refusal{Kind: Precondition, Msg: msg, Err: job.ErrCoolingOff}
}
