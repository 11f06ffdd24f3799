package slurm

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// maxHosts bounds what one hostlist may expand to: no step has more nodes,
// and a typo such as node[1-99999999] must not eat the node's memory.
const maxHosts = 1 << 16

// ErrHostlist is wrapped by every error of ExpandHostlist and ParseTasksPerNode.
var ErrHostlist = errors.New("slurm: bad hostlist")

// ExpandHostlist expands Slurm's hostlist syntax, as in SLURM_STEP_NODELIST,
// into host names in order: "node[1-3,7],gpu[01-02]" is node1 node2 node3
// node7 gpu01 gpu02. Ranges keep their zero padding (the width of the lower
// bound), several bracket groups in one name multiply out left to right
// ("r[1-2]n[1-2]": r1n1 r1n2 r2n1 r2n2), and plain names pass through.
func ExpandHostlist(s string) ([]string, error) {
	var out []string
	for _, item := range splitTop(s) {
		if item == "" {
			return nil, fmt.Errorf("%w %q: an empty name", ErrHostlist, s)
		}
		hosts, err := expandOne(item, maxHosts-len(out))
		if err != nil {
			return nil, fmt.Errorf("%w %q: %v", ErrHostlist, s, err)
		}
		out = append(out, hosts...)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%w %q: no hosts", ErrHostlist, s)
	}
	return out, nil
}

// splitTop splits s at the commas outside brackets.
func splitTop(s string) []string {
	var items []string
	depth, start := 0, 0
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '[':
			depth++
		case ']':
			depth--
		case ',':
			if depth == 0 {
				items = append(items, s[start:i])
				start = i + 1
			}
		}
	}
	return append(items, s[start:])
}

// expandOne expands one name with zero or more bracket groups, into at
// most limit names.
func expandOne(item string, limit int) ([]string, error) {
	open := strings.IndexByte(item, '[')
	if open < 0 {
		if strings.ContainsAny(item, "], \t\n") {
			return nil, fmt.Errorf("%q is not a host name", item)
		}
		return []string{item}, nil
	}
	closing := strings.IndexByte(item[open:], ']')
	if closing < 0 {
		return nil, fmt.Errorf("%q: [ without ]", item)
	}
	closing += open
	prefix, body, rest := item[:open], item[open+1:closing], item[closing+1:]
	if strings.ContainsAny(prefix, "], \t\n") || strings.ContainsRune(body, '[') {
		return nil, fmt.Errorf("%q is not a host name", item)
	}
	nums, err := expandRanges(body, limit)
	if err != nil {
		return nil, fmt.Errorf("%q: %v", item, err)
	}
	tails := []string{""}
	if rest != "" {
		if tails, err = expandOne(rest, limit); err != nil {
			return nil, err
		}
	}
	if len(nums)*len(tails) > limit {
		return nil, fmt.Errorf("more than %d hosts", maxHosts)
	}
	out := make([]string, 0, len(nums)*len(tails))
	for _, n := range nums {
		for _, t := range tails {
			out = append(out, prefix+n+t)
		}
	}
	return out, nil
}

// expandRanges expands the inside of brackets: "1-3,07,10-11".
func expandRanges(body string, limit int) ([]string, error) {
	var out []string
	for _, r := range strings.Split(body, ",") {
		lo, hi, isRange := strings.Cut(r, "-")
		if !isDigits(lo) || isRange && !isDigits(hi) {
			return nil, fmt.Errorf("%q is not a number or a range N-M", r)
		}
		if !isRange {
			hi = lo
		}
		a, err1 := strconv.ParseUint(lo, 10, 63)
		b, err2 := strconv.ParseUint(hi, 10, 63)
		if err1 != nil || err2 != nil {
			return nil, fmt.Errorf("%q: number too large", r)
		}
		if b < a {
			return nil, fmt.Errorf("%q: range runs backwards", r)
		}
		if b-a >= uint64(limit-len(out)) {
			return nil, fmt.Errorf("more than %d hosts", maxHosts)
		}
		for n := a; n <= b; n++ {
			out = append(out, fmt.Sprintf("%0*d", len(lo), n))
		}
	}
	return out, nil
}

func isDigits(s string) bool {
	if s == "" || len(s) > 18 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// ParseTasksPerNode expands SLURM_STEP_TASKS_PER_NODE ("2(x3),1": 2 2 2 1)
// into the task count of each node, in node order.
func ParseTasksPerNode(s string) ([]int, error) {
	var out []int
	for _, item := range strings.Split(s, ",") {
		count, rep := item, "1"
		if c, r, ok := strings.Cut(item, "(x"); ok {
			if !strings.HasSuffix(r, ")") {
				return nil, fmt.Errorf("%w: tasks per node %q: %q has ( without )", ErrHostlist, s, item)
			}
			count, rep = c, strings.TrimSuffix(r, ")")
		}
		n, err1 := strconv.Atoi(count)
		k, err2 := strconv.Atoi(rep)
		if err1 != nil || err2 != nil || n < 1 || k < 1 || k > maxHosts-len(out) {
			return nil, fmt.Errorf("%w: tasks per node %q: %q is not N or N(xK)", ErrHostlist, s, item)
		}
		for range k {
			out = append(out, n)
		}
	}
	return out, nil
}
