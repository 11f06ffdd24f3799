package workerenv

import (
	"strconv"
	"strings"
)

// SubstituteLocalRank replaces torchrun's macro for the local rank in every
// argument, as torch.distributed.elastic.utils.macros.substitute does with
// string.Template(arg).safe_substitute(local_rank=...): "${local_rank}" and
// "$local_rank" where the name ends there (a longer identifier such as
// "$local_ranks" is another, unknown name and stays). "$$" is Template's
// escape: what follows it is not substituted. One difference is meant:
// Template also turns "$$" into "$"; here "$$" stays, since gotrain launch
// runs any program and `sh -c 'echo $$'` must reach the shell as written.
// args is returned itself when nothing changes.
func SubstituteLocalRank(args []string, localRank int) []string {
	var out []string
	for i, a := range args {
		if !strings.Contains(a, "local_rank") {
			continue
		}
		s, ok := substituteOne(a, strconv.Itoa(localRank))
		if !ok {
			continue
		}
		if out == nil {
			out = append(make([]string, 0, len(args)), args...)
		}
		out[i] = s
	}
	if out == nil {
		return args
	}
	return out
}

// substituteOne substitutes the macro in a; ok says whether it did.
func substituteOne(a, rank string) (string, bool) {
	const name = "local_rank"
	var b strings.Builder
	done := 0 // a[:done] is in b
	ok := false
	for i := 0; i < len(a); i++ {
		if a[i] != '$' || i+1 >= len(a) {
			continue
		}
		rest := a[i+1:]
		switch {
		case rest[0] == '$':
			i++ // the escape: the second '$' starts nothing
		case strings.HasPrefix(rest, "{"+name+"}"):
			b.WriteString(a[done:i])
			b.WriteString(rank)
			i += len(name) + 2
			done, ok = i+1, true
		case strings.HasPrefix(rest, name) && (len(rest) == len(name) || !identChar(rest[len(name)])):
			b.WriteString(a[done:i])
			b.WriteString(rank)
			i += len(name)
			done, ok = i+1, true
		}
	}
	if !ok {
		return a, false
	}
	b.WriteString(a[done:])
	return b.String(), true
}

// identChar: Template's identifiers are ASCII letters, digits and '_'.
func identChar(c byte) bool {
	return c == '_' || c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z'
}
