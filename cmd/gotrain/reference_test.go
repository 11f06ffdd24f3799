package main

import (
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// referencePath is the reference page: every command's whole help, made
// from the binary so that it cannot drift from the code.
const referencePath = "../../docs/reference.md"

// TestReferenceDoc: docs/reference.md is every command's --help-all (or
// --help where that is all there is), as the binary prints it. Rewrite it
// with go test ./cmd/gotrain -run TestReferenceDoc -rewrite.
func TestReferenceDoc(t *testing.T) {
	bin := buildBinary(t)
	var b strings.Builder
	b.WriteString(`# gotrain reference

Every command's flags, defaults and details, as the binary's help prints
them. This page is generated from the code (` + "`go test ./cmd/gotrain -run TestReferenceDoc -rewrite`" + `),
and a test fails when it differs from what the binary says.

Exit statuses: a job exits with its failed rank's status (0 when every rank
succeeded); gotrain's own are 1 for a failure, 2 for a usage error (with a
message on stderr; ` + "`--help`" + ` exits 0), and 3 when ` + "`gotrain diagnose`" + ` reports a hang.

`)
	for _, c := range commands() {
		b.WriteString("- [gotrain " + c.name() + "](#gotrain-" + c.name() + "): " + c.synopsis() + "\n")
	}
	env := slices.DeleteFunc(os.Environ(), func(kv string) bool {
		return strings.HasPrefix(kv, "GOTRAIN_") || strings.HasPrefix(kv, "SLURM_") || strings.HasPrefix(kv, "PET_")
	})
	for _, c := range commands() {
		out := ""
		for _, flagArg := range []string{"--help-all", "--help"} {
			cmd := exec.CommandContext(t.Context(), bin, c.name(), flagArg)
			cmd.Env = env
			if o, err := cmd.Output(); err == nil {
				out = string(o)
				break
			}
		}
		if out == "" {
			t.Fatalf("gotrain %s: no help", c.name())
		}
		b.WriteString("\n## gotrain " + c.name() + "\n\n```\n" + strings.TrimRight(out, "\n") + "\n```\n")
	}
	if *rewrite {
		if err := os.WriteFile(referencePath, []byte(b.String()), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(referencePath)
	if err != nil {
		t.Fatal(err)
	}
	if string(want) != b.String() {
		t.Errorf("%s differs from the binary's help: run go test ./cmd/gotrain -run TestReferenceDoc -rewrite", referencePath)
	}
}
