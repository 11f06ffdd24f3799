package cudago

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// gorgonia.org/cu exits the process in its init() when there is no CUDA
// driver, so it must never reach the gotrain binary, with or without the
// cuda tag: gotrain starts on machines without GPUs.
func TestGotrainBinaryDoesNotLinkCu(t *testing.T) {
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go tool in PATH")
	}
	for _, tags := range []string{"", "cuda"} {
		cmd := exec.Command(goTool, "list", "-deps", "-tags", tags, "-f", "{{.ImportPath}}", "github.com/gotrain/gotrain/cmd/gotrain")
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("go list -deps -tags %q ./cmd/gotrain: %v", tags, err)
		}
		deps := strings.Fields(string(out))
		if !slices.Contains(deps, "github.com/gotrain/gotrain/worker/comm") {
			t.Fatalf("go list -deps output looks wrong (no worker/comm): %v", deps)
		}
		for _, d := range deps {
			if d == "gorgonia.org/cu" || strings.HasPrefix(d, "gorgonia.org/cu/") || d == "github.com/gotrain/gotrain/worker/cudago" {
				t.Errorf("with tags %q, cmd/gotrain depends on %s: gorgonia.org/cu would exit gotrain at start on machines without a CUDA driver; keep it behind worker/cudago, which gotrain must not import", tags, d)
			}
		}
	}
}
