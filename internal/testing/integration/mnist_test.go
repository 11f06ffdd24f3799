package integration

import (
	"regexp"
	"strconv"
	"testing"
	"time"
)

var finalLine = regexp.MustCompile(`(?m)^\[rank 0\] final test_accuracy=([0-9.]+) ranks_agree=(true|false)$`)

// TestMNISTDemo is `make demo`: 4 CPU ranks train MNIST through gotrain
// launch and must reach the accuracy the README promises, with identical
// weights on every rank.
func TestMNISTDemo(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("trains for several seconds")
	}
	r := launch(t, 5*time.Minute, "launch", "--nproc-per-node", "4", "--backend", "cpu", "--", bin.mnist)
	if r.code != 0 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
	}
	m := finalLine.FindStringSubmatch(r.stdout)
	if m == nil {
		t.Fatalf("no final line from rank 0:\n%s", r.stdout)
	}
	acc, _ := strconv.ParseFloat(m[1], 64)
	if acc < 0.97 || m[2] != "true" {
		t.Errorf("test_accuracy=%v ranks_agree=%s, want ≥ 0.97 and true\n%s", acc, m[2], r.stdout)
	}
}
