package main

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gotrain/gotrain/cmd/gotrain/internal/torchrun"
	"github.com/gotrain/gotrain/internal/coordinator/host"
	"github.com/gotrain/gotrain/internal/coordinator/replica"
	"github.com/gotrain/gotrain/internal/gossip"
	"github.com/gotrain/gotrain/internal/launcher"
)

// The docs test: what README.md and docs/*.md say about
// gotrain's flags and limits, checked against the code where a machine can
// check it. A flag renamed or a default changed fails here until the docs
// say the same.

// docFiles are the documents a user reads.
var docFiles = []string{"../../README.md", "../../docs/pytorch.md", "../../docs/clusters.md", "../../docs/commands.md",
	"../../docs/gpus.md", "../../docs/development.md", "../../docs/troubleshooting.md", "../../docs/fault-tolerance.md", "../../docs/diagnosis.md", "../../docs/ARCHITECTURE.md", "../../docs/SECURITY.md", "../../examples/kubernetes/README.md"}

// readDocs returns each document's text by path (a missing one is skipped:
// examples' READMEs come and go).
func readDocs(t *testing.T) map[string]string {
	t.Helper()
	docs := map[string]string{}
	for _, p := range docFiles {
		b, err := os.ReadFile(p)
		if os.IsNotExist(err) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		docs[strings.TrimPrefix(p, "../../")] = string(b)
	}
	if len(docs) == 0 {
		t.Fatal("no documents found")
	}
	return docs
}

// otherFlags are flags the docs name that are not gotrain's: another
// program's, each with where it is defined, checked to be there.
var otherFlags = map[string]string{
	// The example programs' and benchmarks' flags: their source defines them.
	"bucket-mb":      "../../examples/mlp",
	"checkpoint-dir": "../../examples/mnist",
	"die-at-step":    "../../examples/mnist",
	"die-rank":       "../../examples/mnist",
	"snapshots":      "../../examples/mnist",
	"transport":      "../../examples/mlp",
	"chunk-first-mb": "../../examples/mlp",
	"fused-sum":      "../../examples/mlp",
	"nccl-symmetric": "../../examples/mlp",
}

// foreignFlags are other tools' flags (Slurm's srun and sbatch, PyTorch's
// torchrun spellings gotrain torchrun takes as they are), which nothing
// here defines.
var foreignFlags = map[string]string{
	"ntasks-per-node":  "srun/sbatch",
	"kill-on-bad-exit": "srun",
	"no-kill":          "srun",
	"requeue":          "sbatch",
	"exclude":          "sbatch/srun",
	"rdzv_id":          "torchrun (taken by gotrain torchrun's underscore spellings)",
	"signal":           "scancel/sbatch",
	"help":             "every command",
	"from":             "a Dockerfile's COPY",
	"build-arg":        "docker/buildah build",
}

// gotrainFlags are the flag sets of every command: launch, coordinator
// and torchrun in process (their defaults are the code's); the others from
// the binary's --help (names only).
func gotrainFlags(t *testing.T) (sets []*flag.FlagSet, names map[string]bool) {
	t.Helper()
	var hc host.Config
	sets = []*flag.FlagSet{launchFlags(new(launcher.Config), new(launchOpts)), coordinatorFlags(&hc, new(string)), torchrunFlags()}
	names = map[string]bool{}
	for _, fs := range sets {
		fs.VisitAll(func(f *flag.Flag) { names[f.Name] = true })
	}
	bin := buildBinary(t)
	flagLine := regexp.MustCompile(`(?m)^\s+-{1,2}([a-z][a-z0-9_-]*)`)
	for _, c := range commands() {
		out, err := exec.CommandContext(t.Context(), bin, c.name(), "--help").CombinedOutput()
		if err != nil {
			t.Fatalf("gotrain %s --help: %v\n%s", c.name(), err, out)
		}
		for _, m := range flagLine.FindAllStringSubmatch(string(out), -1) {
			names[m[1]] = true
		}
	}
	// torchrun's flags, which gotrain torchrun takes (or refuses, saying
	// why) beyond those its --help documents.
	for _, n := range torchrun.Flags() {
		names[n] = true
	}
	// torchrun's underscore spellings of its dashed flags.
	for n := range names {
		names[strings.ReplaceAll(n, "-", "_")] = true
	}
	return sets, names
}

// docFlag is a --flag written in a document's code span.
var docFlag = regexp.MustCompile("`[^`\n]*`")
var flagInSpan = regexp.MustCompile(`(?:^|[\s(=\[|,])--([a-z][a-z0-9_-]*)`)

// Every --flag a document writes in a code span is a flag of gotrain, of
// an example it names, or of a tool listed in foreignFlags.
func TestDocsNameRealFlags(t *testing.T) {
	_, names := gotrainFlags(t)
	for owner, dir := range otherFlags {
		if !defines(t, dir, owner) {
			t.Errorf("otherFlags: %s defines no flag %q any more: drop it from the docs and from otherFlags", dir, owner)
		}
	}
	for doc, text := range readDocs(t) {
		for lineNo, line := range strings.Split(text, "\n") {
			for _, span := range docFlag.FindAllString(line, -1) {
				for _, m := range flagInSpan.FindAllStringSubmatch(strings.Trim(span, "`"), -1) {
					n := m[1]
					if names[n] || otherFlags[n] != "" || foreignFlags[n] != "" {
						continue
					}
					t.Errorf("%s:%d: %s names --%s, which no gotrain command, example or listed tool has", doc, lineNo+1, span, n)
				}
			}
		}
	}
}

// defines says whether the Go package in dir defines a flag called name.
func defines(t *testing.T, dir, name string) bool {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no Go files in %s", dir)
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(b), strconv.Quote(name)) {
			return true
		}
	}
	return false
}

// docDefault is "`--flag` (default V", "`--flag`, default V" or
// "`--flag` defaults to V", V a number, a duration (also "10 min"), an
// address or a boolean; a default followed by "with" holds only where it
// says (checked by a person).
var docDefault = regexp.MustCompile("`--([a-z][a-z0-9-]*)[^`]*`(?: \\(|, | )defaults? (?:to )?`?([0-9][0-9a-z.:]*|true|false)`?( min| s\\b)?( with)?")

// A default the docs give for a flag of launch, coordinator or torchrun
// is the flag's default (a number or a duration, compared as values).
func TestDocsDefaultsAreTheCodes(t *testing.T) {
	sets, _ := gotrainFlags(t)
	checked := 0
	for doc, text := range readDocs(t) {
		for _, m := range docDefault.FindAllStringSubmatch(text, -1) {
			name, said := m[1], strings.TrimRight(m[2], ".")
			if m[4] != "" {
				continue // a default under a condition
			}
			switch m[3] {
			case " min":
				said += "m"
			case " s":
				said += "s"
			}
			var defs []string
			for _, fs := range sets {
				if f := fs.Lookup(name); f != nil {
					defs = append(defs, f.DefValue)
				}
			}
			if len(defs) == 0 {
				continue // another command's flag: TestDocsNameRealFlags checks the name
			}
			checked++
			if !anySame(said, defs) {
				t.Errorf("%s: %q: the docs say --%s defaults to %s; the code's default is %s", doc, m[0], name, said, strings.Join(defs, " or "))
			}
		}
	}
	if checked < 5 {
		t.Errorf("only %d defaults checked: the pattern no longer finds the docs' defaults", checked)
	}
}

func anySame(said string, defs []string) bool {
	for _, d := range defs {
		if said == d {
			return true
		}
		a, errA := time.ParseDuration(said)
		b, errB := time.ParseDuration(d)
		if errA == nil && errB == nil && a == b {
			return true
		}
	}
	return false
}

// SECURITY.md's table of connection bounds quotes the code's constants.
func TestSecurityLimitsAreTheCodes(t *testing.T) {
	text := readDocs(t)["docs/SECURITY.md"]
	secs := func(d time.Duration) string { return fmt.Sprintf("%d s", int(d.Seconds())) }
	for _, row := range []struct {
		port string
		want []string // in the row, in order
	}{
		{"Coordinator gRPC (29400)", []string{
			fmt.Sprintf("%d / %d / %s", host.MaxPendingConns, host.MaxPendingConnsPerIP, secs(host.AuthTimeout)),
			fmt.Sprintf("%d / %d", host.MaxConns, host.MaxConnsPerIP),
		}},
		{"Gossip (+1), TCP", []string{fmt.Sprintf("%d / %d / %s", gossip.MaxStreams, gossip.MaxStreamsPerSource, secs(gossip.StreamTimeout))}},
		{"Raft (+3)", []string{
			fmt.Sprintf("%d / %d / %s", replica.MaxRaftPending, replica.MaxRaftPendingPerSource, secs(replica.RaftAuthTimeout)),
			fmt.Sprintf("%d / %d", replica.MaxRaftConns, replica.MaxRaftConnsPerSource),
		}},
		{"`/metrics`", []string{fmt.Sprintf("%d / %d", host.MaxMetricsConns, host.MaxMetricsConnsPerIP)}},
	} {
		line := ""
		for _, l := range strings.Split(text, "\n") {
			if strings.HasPrefix(l, "| "+row.port+" |") {
				line = l
			}
		}
		if line == "" {
			t.Errorf("SECURITY.md has no bounds row for %s", row.port)
			continue
		}
		rest := line
		for _, w := range row.want {
			i := strings.Index(rest, w)
			if i < 0 {
				t.Errorf("SECURITY.md's row for %s does not say %q (the code's constants):\n%s", row.port, w, line)
				break
			}
			rest = rest[i+len(w):]
		}
	}
	// The prose after the table repeats the gRPC port's authenticated bounds.
	if w := fmt.Sprintf("%d authenticated places per address, %d from %d addresses", host.MaxConnsPerIP, host.MaxConns, host.MaxConns/host.MaxConnsPerIP); !strings.Contains(text, w) {
		t.Errorf("SECURITY.md does not say %q", w)
	}
}
