package explain

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/gotrain/gotrain/internal/launcher/observe"
	gotrainv1 "github.com/gotrain/gotrain/proto/gotrain/v1"
)

// The lines a person reads about the job's course: a restart ("gotrain:
// rank 2 on node3 exited 1 (ImportError: ...): restarting all 8 ranks,
// attempt 2 of 4, in 0.4 s") and, on a node that joined another's
// coordinator, the job it joined.

// RestartLine is the line every node prints when the coordinator
// announces a restart.
func RestartLine(p *gotrainv1.RestartPlanned) string {
	when := "now"
	if w := time.Duration(p.GetWaitMs()) * time.Millisecond; w >= 50*time.Millisecond {
		when = "in " + strconv.FormatFloat(w.Seconds(), 'f', 1, 64) + " s"
		when = strings.Replace(when, ".0 s", " s", 1)
	}
	ranks := fmt.Sprintf("all %d ranks", p.GetWorldSize())
	switch f := p.GetFailure(); {
	case nodeLost(f):
		// The next generation is smaller (elastic) or waits for a node in
		// its place: SizeLine says which once it starts.
		ranks = "the job"
	case p.GetWorldSize() == 1:
		ranks = "the job's one rank"
	}
	return fmt.Sprintf("gotrain: %s: restarting %s, attempt %d of %d, %s",
		failureSummary(p.GetFailure()), ranks, p.GetAttempt(), p.GetMaxAttempts(), when)
}

// failureSummary says in a few words which rank failed, where and how:
// "rank 2 on node3 exited 1 (ImportError: No module named 'foo')".
func failureSummary(f *gotrainv1.WorkerFailure) string {
	if f == nil {
		return "the generation ended"
	}
	if nodeLost(f) {
		return fmt.Sprintf("node %s on %s was lost (%s)", f.GetNodeId(), f.GetHostname(), f.GetReason())
	}
	who := fmt.Sprintf("rank %d on %s", f.GetRank(), f.GetHostname())
	var how string
	switch {
	case f.GetPid() == 0 && len(f.GetStderrTail()) > 0:
		how = "could not be started"
	case f.GetOomKilled():
		how = "was killed by the kernel's OOM killer"
	case f.GetSignal() != "":
		how = "was killed by " + f.GetSignal()
	case cudaOOM(f):
		how = "ran out of GPU memory"
	default:
		how = fmt.Sprintf("exited %d", f.GetExitCode())
	}
	// A signal or the OOM killer is the cause itself: the last line a
	// rank happened to print before it (a library's warning) explains
	// nothing, so only a line that names an error is quoted then.
	killed := f.GetSignal() != "" || f.GetOomKilled()
	l := errorLine(f.GetStderrTail(), !killed)
	if o, ok := observe.FindCUDAOOM(f.GetStderrTail()); ok && !killed {
		l = shorten(o.Line)
	}
	if l != "" {
		how += " (" + l + ")"
	}
	return who + " " + how
}

// nodeLost says whether the failure is a node the job lost (not a rank's).
func nodeLost(f *gotrainv1.WorkerFailure) bool {
	return f != nil && f.GetReason() != "" && f.GetSignal() == "" && len(f.GetStderrTail()) == 0
}

// SizeLine is what every node prints when a generation starts with another
// number of nodes than the one before (an elastic job): "gotrain: going on
// with 3 nodes (3 ranks)" after a loss, "gotrain: node-4 joined: the job
// grows to 4 nodes (4 ranks)" after a join; "" when the size is the same or
// there was no generation before.
func SizeLine(prev, next *gotrainv1.GenerationStarted) string {
	if prev == nil || next == nil || prev.GetGroupWorldSize() == next.GetGroupWorldSize() {
		return ""
	}
	size := fmt.Sprintf("%d %s (%d %s)", next.GetGroupWorldSize(), plural(int(next.GetGroupWorldSize()), "node"), next.GetWorldSize(), plural(int(next.GetWorldSize()), "rank"))
	if next.GetGroupWorldSize() < prev.GetGroupWorldSize() {
		return "gotrain: going on with " + size
	}
	had := map[string]bool{}
	for _, n := range prev.GetNodes() {
		had[n.GetNodeId()] = true
	}
	var joined []string
	for _, n := range next.GetNodes() {
		if !had[n.GetNodeId()] {
			joined = append(joined, n.GetNodeId())
		}
	}
	who := "nodes joined"
	switch len(joined) {
	case 0:
	case 1:
		who = joined[0] + " joined"
	default:
		who = strings.Join(joined, ", ") + " joined"
	}
	return "gotrain: " + who + ": the job grows to " + size
}

func plural(n int, word string) string {
	if n == 1 {
		return word
	}
	return word + "s"
}

// errorLineRE matches the line that names an error: a Python exception, a
// Go panic, an "error:" line.
var errorLineRE = regexp.MustCompile(`^([A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt)\b|panic:|fatal error:|[Ee]rror\b|fork/exec )`)

// errorLine picks the line of a stderr tail that says what went wrong: the
// last one that names an error, else (orLast) the last line; "" for none.
func errorLine(tail []string, orLast bool) string {
	l := ""
	for i := len(tail) - 1; i >= 0; i-- {
		if s := strings.TrimSpace(tail[i]); errorLineRE.MatchString(s) {
			l = s
			break
		}
	}
	if l == "" && orLast {
		l = lastLine(tail) // permanent.go
	}
	return shorten(l)
}

// shorten cuts a quoted line to 100 characters.
func shorten(l string) string {
	if r := []rune(l); len(r) > 100 {
		l = string(r[:99]) + "…"
	}
	return l
}

// cudaOOM says whether f is a rank that exited (no signal) after a CUDA
// out-of-memory error.
func cudaOOM(f *gotrainv1.WorkerFailure) bool {
	if f.GetSignal() != "" || f.GetOomKilled() || f.GetPid() == 0 {
		return false
	}
	_, ok := observe.FindCUDAOOM(f.GetStderrTail())
	return ok
}

// JoinedLine is what a node that joined another's coordinator prints when
// its first generation starts: the run, its size, and this node's ranks.
func JoinedLine(runID, host string, g *gotrainv1.GenerationStarted) string {
	var ranks []int
	for _, r := range g.GetRanks() {
		ranks = append(ranks, int(r.GetRank()))
	}
	return fmt.Sprintf("gotrain: joined run %s: %d ranks on %d nodes; this node (%s) runs %s",
		runID, g.GetWorldSize(), g.GetGroupWorldSize(), host, rankList(ranks))
}

// rankList writes ranks as "rank 3" or "ranks 8-15" (or "ranks 1, 4, 7").
func rankList(ranks []int) string {
	switch len(ranks) {
	case 0:
		return "no ranks"
	case 1:
		return fmt.Sprintf("rank %d", ranks[0])
	}
	contiguous := true
	for i := 1; i < len(ranks); i++ {
		contiguous = contiguous && ranks[i] == ranks[i-1]+1
	}
	if contiguous {
		return fmt.Sprintf("ranks %d-%d", ranks[0], ranks[len(ranks)-1])
	}
	s := make([]string, len(ranks))
	for i, r := range ranks {
		s[i] = strconv.Itoa(r)
	}
	return "ranks " + strings.Join(s, ", ")
}
