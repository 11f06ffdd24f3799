package gputest

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// TestSkipOrFail runs this test binary again with and without
// GOTRAIN_REQUIRE_GPU=1 and a test that calls Skipf: it must skip without
// and fail with.
func TestSkipOrFail(t *testing.T) {
	if os.Getenv("GPUTEST_CHILD") == "1" {
		Skipf(t, "needs %d GPU(s)", 2)
		return
	}
	for _, tc := range []struct {
		require string
		fails   bool
		want    string
	}{
		{"", false, "--- SKIP: TestSkipOrFail"},
		{"0", false, "--- SKIP: TestSkipOrFail"},
		{"1", true, "GOTRAIN_REQUIRE_GPU=1, so this GPU test must run, but it would skip: needs 2 GPU(s)"},
	} {
		cmd := exec.Command(os.Args[0], "-test.run", "^TestSkipOrFail$", "-test.v")
		cmd.Env = append(os.Environ(), "GPUTEST_CHILD=1", RequireEnv+"="+tc.require)
		out, err := cmd.CombinedOutput()
		if (err != nil) != tc.fails || !strings.Contains(string(out), tc.want) {
			t.Errorf("%s=%q: err %v, want failure %t and %q in the output:\n%s", RequireEnv, tc.require, err, tc.fails, tc.want, out)
		}
	}
}
