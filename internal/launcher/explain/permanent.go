package explain

import (
	"fmt"
	"regexp"
	"strings"
)

// A failure that can only repeat is not worth a restart: the program cannot
// be executed (not found, not a program for this machine, not executable),
// or a Python program ends with an import or syntax error. The agent says
// so in its exit report (ReportWorkerExitRequest.permanent) unless
// --retry-permanent; the coordinator then ends the job instead of
// restarting, when the generation made no progress (internal/coordinator/job).

// spawnPermanent are the spawn errors (fork/exec's) that can only repeat.
var spawnPermanent = []struct{ text, why string }{
	{"exec format error", "not a program for this machine (exec format error)"},
	{"permission denied", "not executable (permission denied)"},
	{"no such file or directory", "not found"},
	{"executable file not found", "not found on PATH"},
}

// pythonPermanent is the last line of a Python traceback that no restart
// changes: the module is missing, or the source does not compile.
var pythonPermanent = regexp.MustCompile(`^(ImportError|ModuleNotFoundError|SyntaxError|IndentationError|TabError)(:|$)`)

// PermanentCause says why a rank's failure can only repeat, or "" when it
// may not: spawnErr is why its process could not start ("" when it ran),
// tail the last lines of its stderr.
func PermanentCause(spawnErr string, tail []string) string {
	if spawnErr != "" {
		low := strings.ToLower(spawnErr)
		for _, p := range spawnPermanent {
			if strings.Contains(low, p.text) {
				return fmt.Sprintf("the program cannot be executed: %s", p.why)
			}
		}
		return ""
	}
	last := lastLine(tail)
	if !pythonPermanent.MatchString(last) || !pythonTraceback(tail) {
		return ""
	}
	return fmt.Sprintf("the Python program failed with %s", last)
}

// pythonTraceback says whether tail holds a Python traceback's frames.
func pythonTraceback(tail []string) bool {
	for _, l := range tail {
		if strings.HasPrefix(l, "Traceback (most recent call last):") || strings.HasPrefix(strings.TrimSpace(l), `File "`) {
			return true
		}
	}
	return false
}

// lastLine is tail's last line that is not blank, trimmed.
func lastLine(tail []string) string {
	for i := len(tail) - 1; i >= 0; i-- {
		if l := strings.TrimSpace(tail[i]); l != "" {
			return l
		}
	}
	return ""
}
