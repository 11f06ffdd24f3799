package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Run as a symlink named torchrun, gotrain is gotrain torchrun: the same
// help, the same usage errors (exit 2), and notes for flags without effect.
func TestTorchrunSymlink(t *testing.T) {
	bin := buildBinary(t)
	link := filepath.Join(t.TempDir(), "torchrun")
	if err := os.Symlink(bin, link); err != nil {
		t.Fatal(err)
	}
	for _, b := range []struct {
		bin  string
		args []string
	}{{bin, []string{"torchrun"}}, {link, nil}} {
		run := func(args ...string) (string, string, int) {
			return runGotrain(t, b.bin, append(append([]string(nil), b.args...), args...)...)
		}
		if stdout, _, code := run("--help"); code != 0 || !strings.HasPrefix(stdout, "Usage: gotrain torchrun") {
			t.Errorf("%s %v --help: exit %d, stdout %q", b.bin, b.args, code, stdout)
		}
		for _, tc := range []struct {
			args []string
			want string
		}{
			{[]string{"--nproc_per_node=2", "--bogus", "t.py"}, "gotrain torchrun: unknown flag --bogus"},
			{[]string{"--nproc-per-node", "two", "t.py"}, `--nproc-per-node "two"`},
			{[]string{"--standalone"}, "no training script given"},
		} {
			stdout, stderr, code := run(tc.args...)
			if code != 2 || stdout != "" || !strings.Contains(stderr, tc.want) {
				t.Errorf("%s %v %v: exit %d, stdout %q, stderr %q; want exit 2 and %q", b.bin, b.args, tc.args, code, stdout, stderr, tc.want)
			}
		}
		// A flag without effect is noted once; the job then runs (here: no
		// such script, so python3 fails, or gotrain says it is missing).
		_, stderr, _ := run("--nproc_per_node=1", "--tee", "3", "--no-python", "/no/such/program")
		if strings.Count(stderr, "note: --tee 3 has no effect") != 1 {
			t.Errorf("%s %v --tee 3: stderr %q, want one note", b.bin, b.args, stderr)
		}
	}
}
