package relay

import (
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	gotrainv1 "github.com/gotrain/gotrain/proto/gotrain/v1"
)

// Hang evidence holds a rank's stacks and what it printed: it is its user's
// alone (0600), and a link planted where it goes is not written through.
func TestEvidenceFilePrivate(t *testing.T) {
	dir := t.TempDir()
	req := &gotrainv1.EvidenceRequest{RequestId: 7, Generation: 2}
	ev := []*gotrainv1.Evidence{{Kind: "stacks", Rank: 1, Pid: 42, Text: "goroutine 1 [chan receive]"}}
	writeEvidenceFile(dir, req, 1, ev)
	name := filepath.Join(dir, "hang-gen2-verdict7-rank1.txt")
	st, err := os.Stat(name)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o600 {
		t.Errorf("%s: mode %v, want 0600", name, st.Mode().Perm())
	}
	if b, _ := os.ReadFile(name); !strings.Contains(string(b), "goroutine 1 [chan receive]") {
		t.Errorf("%s lacks the evidence:\n%s", name, b)
	}

	victim := filepath.Join(t.TempDir(), "victim")
	if err := os.WriteFile(victim, []byte("precious\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	planted := filepath.Join(dir, "hang-gen3-verdict7-rank1.txt")
	if err := os.Symlink(victim, planted); err != nil {
		t.Fatal(err)
	}
	writeEvidenceFile(dir, &gotrainv1.EvidenceRequest{RequestId: 7, Generation: 3}, 1, ev)
	if b, _ := os.ReadFile(victim); string(b) != "precious\n" {
		t.Errorf("the planted link's target was written: %q", b)
	}
	if st, err := os.Lstat(planted); err != nil || st.Mode()&fs.ModeSymlink == 0 {
		t.Errorf("the planted link was replaced (%v)", err)
	}
}
