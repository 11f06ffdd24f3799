package state

import (
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/gotrain/gotrain/internal/coordinator/job"
	"github.com/gotrain/gotrain/internal/nodehealth/policy"
)

// Admission: whether a Join is taken is one decision (admit), made before
// the log, against the replicated state, and again by every replica as it
// applies the entry (which may find the state changed since, and refuse:
// deterministically, from the log alone). A refused request leaves nothing
// in the log nor in the snapshot.

// maxNodeText bounds a joining node's hostname, address and each GPU's
// strings.
const maxNodeText = 1024

// maxPreflightText bounds the lines a node's failed preflight sends: a
// few checks' verdicts.
const maxPreflightText = 8 << 10

// admission is the decision on a Join: the same node again (Retry, its
// id), or a new node (Event), with the settings' warnings.
type admission struct {
	Retry    string
	Event    job.NodeJoined
	Warnings []string
}

// Admit says whether j would be taken now (a retried Join is); it changes
// nothing. The server asks before proposing j.
func (s *State) Admit(j Join) error {
	_, err := s.admit(s.now, j)
	return err
}

func (s *State) admit(now time.Time, j Join) (admission, error) {
	if id, ok := s.joinKeys[JoinKey(j)]; ok && s.m.HasNode(id) {
		// The same agent's Join again: its answer was lost (a leader
		// change after the commit, a connection that broke). It is the
		// same node, not one more, which a job at its size would refuse.
		warnings, _ := CheckSettings(s.m.Config(), j.Settings)
		return admission{Retry: id, Warnings: warnings}, nil
	}
	if err := s.checkBounds(j.Node); err != nil {
		return admission{}, err
	}
	if err := s.coolingOff(now, j); err != nil { // health.go
		return admission{}, err
	}
	warnings, err := CheckSettings(s.m.Config(), j.Settings)
	if err != nil {
		return admission{}, &Refusal{Kind: Precondition, Msg: err.Error(), Err: err}
	}
	ev := job.NodeJoined{NodeID: fmt.Sprintf("node-%d", s.nodeSeq+1), Info: j.Node, Host: j.Host, NodeRank: max(j.NodeRank, -1)}
	if err := s.m.Admit(ev); err != nil {
		return admission{}, err
	}
	return admission{Event: ev, Warnings: warnings}, nil
}

// checkBounds bounds a Join by the config entry's limits: nproc per node,
// ranks per job, the size of the node's facts. The work is proportional to
// the nodes present, not to the request.
func (s *State) checkBounds(n job.NodeInfo) error {
	perNode, perJob := s.cfg.NprocPerNode, s.cfg.RanksPerJob
	if perNode > 0 && n.Nproc > perNode {
		return refuse(Invalid, "join from %q: nproc is %d, at most %d workers per node: check --nproc-per-node", Truncate(n.Hostname, 64), n.Nproc, perNode)
	}
	if perNode > 0 && len(n.GPUs) > perNode {
		return refuse(Invalid, "join: %d GPUs, at most %d per node", len(n.GPUs), perNode)
	}
	long := len(n.Hostname) > maxNodeText || len(n.Address) > maxNodeText
	for _, g := range n.GPUs {
		long = long || len(g.UUID) > maxNodeText || len(g.PCIBusID) > maxNodeText || len(g.Name) > maxNodeText
	}
	if long {
		return refuse(Invalid, "join: a hostname, address or GPU field is longer than %d bytes", maxNodeText)
	}
	if len(n.PreflightFailure) > maxPreflightText || !utf8.ValidString(n.PreflightFailure) {
		return refuse(Invalid, "join: the preflight failure is longer than %d bytes or not UTF-8", maxPreflightText)
	}
	ranks := 0
	for id, np := range s.nproc {
		if s.m.HasNode(id) {
			ranks += np
		}
	}
	if perJob > 0 && ranks+n.Nproc > perJob {
		return refuse(Exhausted, "join from %q: the job has %d ranks, %d more would exceed its maximum of %d ranks", Truncate(n.Hostname, 64), ranks, n.Nproc, perJob)
	}
	return nil
}

// applyJoin joins the node of j.
func (s *State) applyJoin(now time.Time, j Join) (Joined, error) {
	a, err := s.admit(now, j)
	if err != nil {
		s.log(LevelWarn, "join rejected", "hostname", Truncate(j.Node.Hostname, 64), "err", err)
		return Joined{}, err
	}
	if a.Retry != "" {
		s.log(LevelInfo, "node joined again (its agent did not get the answer)", "node_id", a.Retry)
		return Joined{ID: a.Retry, Warnings: a.Warnings, HostReplica: slices.Contains(s.asked, a.Retry) && !s.hosts(a.Retry)}, nil
	}
	info, id := a.Event.Info, a.Event.NodeID
	for _, w := range a.Warnings {
		s.log(LevelWarn, "join", "hostname", info.Hostname, "warning", w)
	}
	acts, err := s.m.Step(now, a.Event)
	if err != nil {
		s.log(LevelWarn, "join rejected", "hostname", info.Hostname, "err", err)
		return Joined{}, err
	}
	s.nodeSeq++
	s.out[id] = &Outbox{} // before the actions: the start may include this node
	s.joinKeys[JoinKey(j)] = id
	s.nproc[id] = info.Nproc
	s.hostnames[id] = info.Hostname
	if info.PreflightFailure != "" {
		// Taken: the job cannot start without it, and fails (job.failPreflight).
		s.record(now, info.Hostname, policy.Preflight, "", info.PreflightFailure) // health.go
	}
	s.log(LevelInfo, "node joined", "node_id", id, "hostname", info.Hostname, "address", info.Address, "nproc", info.Nproc, "gpus", len(info.GPUs))
	s.actions(acts)
	s.deadline()
	return Joined{ID: id, Warnings: a.Warnings, HostReplica: s.askReplica(id, info.Address, info.Hostname)}, nil
}

// JoinKey identifies the agent process behind a Join: its host, address,
// pid, the port it offered and its CSR's hash, which a retry of the same
// Join repeats; only the holder of the CSR's key can use the node
// certificate that the retry gets.
func JoinKey(j Join) string {
	n := j.Node
	return fmt.Sprintf("%s|%s|%d|%d|%x", n.Hostname, n.Address, n.AgentPID, n.FreePort, j.CSR)
}

// Cut ends a text Truncate cut.
const Cut = " …(cut by the coordinator)"

// Truncate cuts s to at most max bytes at a rune boundary, saying so.
func Truncate(s string, max int) string {
	if len(s) <= max {
		return s
	}
	i := max - len(Cut)
	for i > 0 && !utf8.RuneStart(s[i]) {
		i--
	}
	return strings.ToValidUTF8(s[:i], "") + Cut
}
