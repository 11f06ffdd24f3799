// The hang detector's English: how collectives, ranks and culprits are named
// in verdicts' summaries and details.

package job

import (
	"fmt"
	"strings"
)

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
