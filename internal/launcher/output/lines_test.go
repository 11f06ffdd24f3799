package output

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gotrain/gotrain/internal/launcher/supervise"
	"github.com/gotrain/gotrain/internal/testing/testkit"
)

// A survivor resumed under a new rank: its lines go under the new prefix
// into the new rank's file, and its old rank's file ends, saying so.
func TestRouteBecomesAnotherRank(t *testing.T) {
	dir := t.TempDir()
	open := func(rank int) *os.File {
		f, err := OpenLogFile(filepath.Join(dir, fmt.Sprintf("rank%d.log", rank)))
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(f, "=== gotrain: rank %d\n", rank) // the agent's header line
		return f
	}
	var out testkit.Buffer
	con := NewConsole(&out)
	rt := NewRoute(2, 2, Options{}, open(2), nil)
	rt.Line(con, supervise.Stdout, []byte("as rank 2"))
	rt.Become(0, 0, open(0))
	rt.Line(con, supervise.Stdout, []byte("as rank 0"))
	rt.Close(supervise.Exit{})
	if want := "[rank 2] as rank 2\n[rank 0] as rank 0\n"; out.String() != want {
		t.Errorf("console %q, want %q", out.String(), want)
	}
	read := func(name string) string {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	if r2 := read("rank2.log"); !strings.HasSuffix(r2, "as rank 2\n=== gotrain: rank 2 continues as rank 0\n") {
		t.Errorf("rank2.log:\n%s\nwant its line, then where the rank changed", r2)
	}
	if r0 := read("rank0.log"); !strings.Contains(r0, "\nas rank 0\n=== gotrain: rank 0 ended: ") || strings.Contains(r0, "as rank 2") {
		t.Errorf("rank0.log:\n%s\nwant only the line written as rank 0, then the end", r0)
	}
}
