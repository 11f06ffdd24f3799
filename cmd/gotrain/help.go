package main

import (
	"flag"
	"fmt"
	"io"
	"reflect"
	"regexp"
	"strings"
	"time"
)

// A command's --help lists its flags by group, the essentials first, in
// the order the groups name them; the standard flag package parses them.

// flagGroup is one titled run of flags in a command's --help.
type flagGroup struct {
	title string
	names []string
}

// The titles, so that every command's help reads alike.
const (
	groupEssentials = "Essentials"
	groupWorkers    = "Workers and standbys"
	groupCluster    = "Cluster (several nodes)"
	groupSecurity   = "Security"
	groupDiagnosis  = "Diagnosis and metrics"
	groupOutput     = "Output"
	groupSnapshots  = "In-memory snapshots"
	groupProgram    = "Program"
	groupOther      = "Other" // a flag no group names: TestHelpGroupsCoverFlags fails on it
)

// launchGroups orders gotrain launch's flags.
var launchGroups = []flagGroup{
	{groupEssentials, []string{"nproc-per-node", "gpus", "backend", "nnodes", "max-restarts", "restart-backoff", "retry-permanent"}},
	{groupWorkers, []string{"grace-period", "standby", "standby-preload", "standby-timeout", "ranks-per-gpu", "signals-to-handle", "role", "store-port"}},
	{groupCluster, []string{"coordinator", "coordinator-listen", "node-addr", "node-rank", "run-id", "join-timeout", "rendezvous-timeout", "node-timeout", "join-settle", "coordinator-replicas", "gossip-port", "no-gossip"}},
	{groupSecurity, []string{"ca-hash", "tls-ca", "insecure-skip-ca-check", "job-token-file", "job-token", "tls-cert", "tls-key"}},
	{groupDiagnosis, []string{"preflight", "hang-timeout", "on-hang", "on-straggler", "straggler-persist", "metrics-addr"}},
	{groupSnapshots, []string{"snapshot-memory"}},
	{groupOutput, []string{"log-dir", "output", "redirects", "console-ranks", "verbose", "log-format"}},
}

// coordinatorGroups orders gotrain coordinator's flags.
var coordinatorGroups = []flagGroup{
	{groupEssentials, []string{"nnodes", "max-restarts", "restart-backoff", "listen"}},
	{groupCluster, []string{"peers", "run-id", "rendezvous-timeout", "node-timeout", "join-settle", "coordinator-replicas", "gossip-port", "no-gossip"}},
	{groupSecurity, []string{"job-token-file", "job-token", "tls-cert", "tls-key"}},
	{groupDiagnosis, []string{"hang-timeout", "on-hang", "on-straggler", "straggler-persist", "metrics-addr"}},
	{groupOutput, []string{"log-format"}},
}

// torchrunGroups orders the flags gotrain torchrun documents.
var torchrunGroups = []flagGroup{
	{groupEssentials, []string{"nproc-per-node", "nnodes", "max-restarts", "standalone"}},
	{groupProgram, []string{"module", "no-python"}},
	{groupWorkers, []string{"signals-to-handle"}},
	{groupCluster, []string{"rdzv-endpoint", "rdzv-backend", "master-addr", "master-port", "node-rank", "rdzv-id"}},
	{groupOutput, []string{"log-dir"}},
}

// helpAll is the flag that asks for the whole help where --help is short.
const helpAll = "help-all"

// fullUsage is, for a command whose --help is short, its --help-all.
var fullUsage = map[*flag.FlagSet]func(){}

// setShortUsage makes fs's --help print shortHead and the flags named in
// short, then how to see the rest; --help-all prints the whole help, as
// setGroupedUsage says.
func setShortUsage(fs *flag.FlagSet, shortHead string, short []string, head string, groups []flagGroup, tail string) {
	setGroupedUsage(fs, head, groups, tail)
	fullUsage[fs] = fs.Usage
	fs.Bool(helpAll, false, "print every flag, by group, and the details")
	fs.Usage = func() {
		w := fs.Output()
		fmt.Fprintln(w, strings.TrimSpace(shortHead))
		fmt.Fprintln(w)
		fmt.Fprintln(w, "Flags:")
		shown := map[string]bool{}
		for _, name := range short {
			printFlag(w, fs.Lookup(name))
			shown[name] = true
		}
		var titles []string
		more := 0
		for _, g := range groupFlags(fs, groups) {
			n := 0
			for _, name := range g.names {
				if !shown[name] {
					n++
				}
			}
			if n > 0 {
				titles = append(titles, strings.ToLower(g.title))
			}
			more += n
		}
		fmt.Fprintln(w)
		for _, l := range wrap(fmt.Sprintf("%d more flags (%s) and the details:", more, strings.Join(titles, "; ")), 76) {
			fmt.Fprintln(w, l)
		}
		fmt.Fprintf(w, "  %s --help-all\n", fs.Name())
	}
}

// setGroupedUsage makes fs's --help print head, then its flags by groups
// (a flag no group names comes last, under groupOther), then tail.
func setGroupedUsage(fs *flag.FlagSet, head string, groups []flagGroup, tail string) {
	fs.Usage = func() {
		w := fs.Output()
		fmt.Fprintln(w, strings.TrimSpace(head))
		fmt.Fprintln(w)
		fmt.Fprintln(w, "Flags:")
		for _, g := range groupFlags(fs, groups) {
			fmt.Fprintf(w, "\n%s:\n", g.title)
			for _, name := range g.names {
				printFlag(w, fs.Lookup(name))
			}
		}
		if tail = strings.TrimSpace(tail); tail != "" {
			fmt.Fprintln(w)
			fmt.Fprintln(w, tail)
		}
	}
}

// groupFlags returns groups with the names fs lacks left out, and the
// flags that no group names in a last group of their own.
func groupFlags(fs *flag.FlagSet, groups []flagGroup) []flagGroup {
	named := map[string]bool{}
	var out []flagGroup
	for _, g := range groups {
		var have []string
		for _, n := range g.names {
			if fs.Lookup(n) != nil && !named[n] {
				have = append(have, n)
				named[n] = true
			}
		}
		if len(have) > 0 {
			out = append(out, flagGroup{g.title, have})
		}
	}
	var rest []string
	fs.VisitAll(func(f *flag.Flag) {
		if !named[f.Name] && f.Name != helpAll {
			rest = append(rest, f.Name)
		}
	})
	if len(rest) > 0 {
		out = append(out, flagGroup{groupOther, rest})
	}
	return out
}

// printFlag writes one flag the way flag.PrintDefaults does, with two
// dashes and its help wrapped to the terminal's usual width.
func printFlag(w io.Writer, f *flag.Flag) {
	kind, usage := flag.UnquoteUsage(f)
	line := "  --" + f.Name
	if kind != "" {
		line += " " + kind
	}
	fmt.Fprintln(w, line)
	if !isZeroDefault(f) && !strings.Contains(f.Name, "token") { // --job-token's default is the secret in the environment
		usage += fmt.Sprintf(" (default %s)", f.DefValue)
	}
	for _, l := range wrap(usage, 72) {
		fmt.Fprintln(w, "      "+l)
	}
}

// isZeroDefault says whether f's default is its type's zero value (which
// --help leaves out, as flag.PrintDefaults does).
func isZeroDefault(f *flag.Flag) bool {
	switch f.DefValue {
	case "", "0", "false", "0s", "[]":
		return true
	}
	t := reflect.TypeOf(f.Value)
	if t.Kind() == reflect.Pointer {
		z := reflect.New(t.Elem()).Interface().(flag.Value)
		defer func() { _ = recover() }() // a Value whose String needs its fields set
		return z.String() == f.DefValue
	}
	return false
}

// wrap breaks s into lines of at most width runes, at spaces.
func wrap(s string, width int) []string {
	var lines []string
	var cur strings.Builder
	for _, word := range strings.Fields(s) {
		if cur.Len() > 0 && cur.Len()+1+len(word) > width {
			lines = append(lines, cur.String())
			cur.Reset()
		}
		if cur.Len() > 0 {
			cur.WriteByte(' ')
		}
		cur.WriteString(word)
	}
	if cur.Len() > 0 {
		lines = append(lines, cur.String())
	}
	return lines
}

// The flag package's errors, which flagError rewrites for people.
var (
	undefinedFlag = regexp.MustCompile(`^flag provided but not defined: -+(.*)$`)
	invalidValue  = regexp.MustCompile(`^invalid (?:boolean )?value "(.*)" for (?:flag )?-+([^:]*): (.*)$`)
	needsArgument = regexp.MustCompile(`^flag needs an argument: -+(.*)$`)
)

// flagError turns the flag package's parse error into a usage error that
// names the flag with two dashes and says what to do: the nearest flag for
// a misspelt one, the unit a duration lacks. args are the command line, for
// the torchrun spellings gotrain launch answers (torchrunSpelling).
func flagError(fs *flag.FlagSet, err error, args []string) error {
	msg := err.Error()
	if m := undefinedFlag.FindStringSubmatch(msg); m != nil {
		name := m[1]
		if fs.Name() == "gotrain launch" {
			if ue := torchrunSpelling(name, args); ue != nil {
				return ue
			}
		}
		ue := &usageError{msg: "unknown flag --" + name}
		if near := nearestFlag(fs, name); near != "" {
			ue.hint = fmt.Sprintf("Did you mean --%s?", near)
		}
		return ue
	}
	if m := needsArgument.FindStringSubmatch(msg); m != nil {
		return &usageError{msg: "--" + m[1] + " needs a value", hint: "Give it as --" + m[1] + " VALUE or --" + m[1] + "=VALUE."}
	}
	if m := invalidValue.FindStringSubmatch(msg); m != nil {
		value, name, why := m[1], m[2], m[3]
		f := fs.Lookup(name)
		if f != nil && isDuration(f) {
			hint := fmt.Sprintf("Give a duration with a unit, e.g. --%s 30s (units: ms, s, m, h).", name)
			if isNumber(value) {
				hint = fmt.Sprintf("Give a unit, e.g. --%s %ss (units: ms, s, m, h).", name, value)
			}
			return &usageError{msg: fmt.Sprintf("--%s %s: not a duration", name, value), hint: hint}
		}
		if why == "parse error" || strings.HasPrefix(why, "strconv.") {
			why = "not a number"
		}
		return &usageError{msg: fmt.Sprintf("invalid value %q for --%s: %s", value, name, why)}
	}
	return &usageError{msg: msg}
}

func isDuration(f *flag.Flag) bool {
	g, ok := f.Value.(flag.Getter)
	if !ok {
		return false
	}
	_, ok = g.Get().(time.Duration)
	return ok
}

func isNumber(s string) bool {
	_, err := fmt.Sscanf(s, "%g", new(float64))
	return err == nil && strings.Trim(s, "0123456789.-+") == ""
}

// nearestFlag returns fs's flag nearest to name (underscores read as
// dashes) by edit distance, when it is near enough to be a misspelling:
// at most 2 edits, and fewer than half of name.
func nearestFlag(fs *flag.FlagSet, name string) string {
	name = strings.ReplaceAll(strings.SplitN(name, "=", 2)[0], "_", "-")
	best, bestD := "", 3
	fs.VisitAll(func(f *flag.Flag) {
		d := editDistance(name, f.Name)
		if strings.HasPrefix(f.Name, name) && len(name) >= 4 {
			d = min(d, 1) // a prefix: --nproc for --nproc-per-node
		}
		if d < bestD && 2*d < len(name) {
			best, bestD = f.Name, d
		}
	})
	return best
}

// editDistance is the Levenshtein distance of a and b.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
