package preflight

import (
	"fmt"
	"strings"
	"time"
)

// The gang check: after every node of a generation passed its own checks,
// and before the first step, one all-reduce across the nodes (one
// participant per node). A node that does not join in time, or whose link
// holds the whole job back, is named. This file is the pure half: the
// figures in, who is out.

// More checks, of the gang.
const (
	CheckGangLatency Check = "gang-allreduce-latency"
	CheckGangJoin    Check = "gang-join"
)

// GangConfig is what the gang check measures and expects.
type GangConfig struct {
	// Bytes and Rounds: the job-wide bandwidth all-reduce; PairBytes the
	// all-reduce between the leader and each other node, which finds the
	// node behind a slow gang.
	Bytes, PairBytes, Rounds int
	// JoinWait is how long the leader waits for every node to join;
	// Budget bounds the measurement after it. Together they bound the
	// check: a node that never comes does not hold the job.
	JoinWait, Budget time.Duration
	// MinBusBW (MB/s) and MaxLatency are the gate, for the gang and for
	// each pair: far from what healthy nodes do over any data-centre
	// network (hundreds of MB/s, well under a millisecond).
	MinBusBW   float64
	MaxLatency time.Duration
}

// QuickGang and FullGang are the gang check of --preflight quick and full:
// each fits in well under 30 s at 64 nodes, joining included.
var (
	QuickGang = GangConfig{Bytes: 1 << 20, PairBytes: 256 << 10, Rounds: 3, JoinWait: 8 * time.Second, Budget: 8 * time.Second, MinBusBW: 5, MaxLatency: 100 * time.Millisecond}
	FullGang  = GangConfig{Bytes: 8 << 20, PairBytes: 1 << 20, Rounds: 5, JoinWait: 10 * time.Second, Budget: 14 * time.Second, MinBusBW: 5, MaxLatency: 100 * time.Millisecond}
)

// Total is the longest the check takes on a member that waits for the
// leader's verdict.
func (c GangConfig) Total() time.Duration { return c.JoinWait + c.Budget + verdictSlack }

// verdictSlack is how much longer than the leader a member waits for the
// leader's verdict: the leader's clock and its last round run a little late.
const verdictSlack = 3 * time.Second

// GangMember is one node of the gang, as the leader saw it.
type GangMember struct {
	NodeID string `json:"node_id"`
	// Host names the node in lines (its hostname; the node id when the
	// coordinator did not say).
	Host   string `json:"host"`
	Joined bool   `json:"joined"`
	// Pair: the figures of this node's all-reduce with the leader (none
	// for the leader, or a pair that could not run at all).
	Pair []Figure `json:"-"`
	// Skipped: the leader's budget ran out before this node's turn; it
	// is neither blamed nor cleared.
	Skipped bool `json:"-"`
}

// GangFigures is what the leader measured: Members[0] is the leader.
type GangFigures struct {
	Members  []GangMember
	Gang     []Figure
	JoinWait time.Duration
}

// GangVerdict is the gang check's word on the job.
type GangVerdict struct {
	Passed bool `json:"passed"`
	// Gang is the job-wide all-reduce's verdicts (empty when fewer than
	// two nodes joined).
	Gang []Verdict `json:"gang,omitempty"`
	// Out are the failed nodes' verdicts, one per node, and OutIDs their
	// node ids. A gang that failed with no node to blame has none: the
	// job cannot go on without a node, and does not start.
	Out    []Verdict `json:"out,omitempty"`
	OutIDs []string  `json:"out_ids,omitempty"`
	// Elastic: the leader knows the job runs under --nnodes MIN:MAX, so
	// that it goes on without the nodes out; for a node that does not
	// know the job's --nnodes. Not JudgeGang's: the leader sets it.
	Elastic bool `json:"elastic,omitempty"`
}

// IsOut says whether node id failed the gang check.
func (v GangVerdict) IsOut(id string) bool {
	for _, o := range v.OutIDs {
		if o == id {
			return true
		}
	}
	return false
}

// Summary is the gang's figures for the line that says it passed.
func (v GangVerdict) Summary() string {
	return summary(v.Gang)
}

func summary(vs []Verdict) string {
	var parts []string
	for _, x := range vs {
		if x.Expected != "" {
			parts = append(parts, fmt.Sprintf("%s %s", x.Check, strings.SplitN(x.Measured, " (", 2)[0]))
		}
	}
	return strings.Join(parts, ", ")
}

// gangFix is what to do about a node the gang check names.
const (
	gangJoinFix = "check that this node's agent runs and reaches the coordinator and the other nodes (firewall, routes); `gotrain doctor` on it"
	gangLinkFix = "this node's network is slow (a degraded NIC or cable, a wrong MTU, traffic shaping with `tc qdisc`, a congested switch port): check `ip -s link`, `tc qdisc` and `ethtool` on it"
)

// JudgeGang decides who is out from the leader's figures. A node that did
// not join is out. When the gang's all-reduce passes, no other node is.
// When it fails, the pairs with the leader name the culprit: the nodes
// whose pair failed, unless most pairs failed (at least two), which
// blames the leader itself; no pair failing blames no node.
func JudgeGang(f GangFigures) GangVerdict {
	var v GangVerdict
	if len(f.Members) == 0 {
		return GangVerdict{Passed: true}
	}
	out := func(id string, x Verdict) {
		v.Out, v.OutIDs = append(v.Out, x), append(v.OutIDs, id)
	}
	joined := 0
	for _, m := range f.Members {
		if !m.Joined {
			out(m.NodeID, Verdict{Node: m.Host, Check: CheckGangJoin, Measured: fmt.Sprintf("did not join within %s", f.JoinWait),
				Expected: "every node of the generation joins", Fix: gangJoinFix})
			continue
		}
		joined++
	}
	leader := f.Members[0]
	if !leader.Joined || joined < 2 {
		v.Passed = len(v.Out) == 0
		return v
	}
	gang := Judge(leader.Host, f.Gang)
	v.Gang = gang.Verdicts
	if gang.Passed {
		v.Passed = len(v.Out) == 0
		return v
	}
	type bad struct {
		m GangMember
		v Verdict
	}
	var bads []bad
	pairs := 0
	for _, m := range f.Members[1:] {
		if !m.Joined || m.Skipped {
			continue
		}
		pairs++
		if len(m.Pair) == 0 {
			bads = append(bads, bad{m, Verdict{Node: m.Host, Check: CheckGang, Subject: "link to " + leader.Host,
				Measured: "no figures: the all-reduce with the leader did not run", Expected: "an all-reduce with the leader", Fix: gangLinkFix}})
			continue
		}
		if r := Judge(m.Host, m.Pair); !r.Passed {
			x := r.Failed()[0]
			x.Fix = gangLinkFix
			bads = append(bads, bad{m, x})
		}
	}
	switch {
	case len(bads) >= 2 && 2*len(bads) > pairs:
		x := bads[0].v
		out(leader.NodeID, Verdict{Node: leader.Host, Check: x.Check, Subject: fmt.Sprintf("its links to %d of %d nodes", len(bads), pairs),
			Measured: x.Measured + " with " + bads[0].m.Host, Expected: x.Expected, Fix: gangLinkFix})
	default:
		for _, b := range bads {
			out(b.m.NodeID, b.v)
		}
	}
	return v
}
