package jobenv

import (
	"slices"
	"strings"
	"testing"
)

// Workers see what torchrun sets: GROUP_WORLD_SIZE (nodes), ROLE_*, and a
// TORCHELASTIC_ERROR_FILE of their own in the agent's socket directory.
func TestTorchrunVariables(t *testing.T) {
	v := Vars{Rank: 5, WorldSize: 8, LocalRank: 1, LocalWorldSize: 4, Generation: 3, AgentSocket: "/tmp/gotrain-agent-1-x/agent.sock"}
	env := v.Environ()
	for _, want := range []string{"GROUP_WORLD_SIZE=2", "ROLE_NAME=default", "ROLE_RANK=5", "ROLE_WORLD_SIZE=8",
		"TORCHELASTIC_ERROR_FILE=/tmp/gotrain-agent-1-x/error-gen3-rank5.json"} {
		if !slices.Contains(env, want) {
			t.Errorf("Environ() lacks %s: %q", want, env)
		}
	}
	if got := Strip([]string{"ROLE_RANK=9", "TORCHELASTIC_ERROR_FILE=/x", "HOME=/h"}); !slices.Equal(got, []string{"HOME=/h"}) {
		t.Errorf("Strip kept a stale torchrun variable: %q", got)
	}
}

func TestTorchrunDefaults(t *testing.T) {
	for _, tc := range []struct {
		nproc   int
		omp     string
		want    string
		warning bool
	}{
		{1, "", "TORCHELASTIC_MAX_RESTARTS=2", false},
		{2, "", "TORCHELASTIC_MAX_RESTARTS=2 OMP_NUM_THREADS=1", true},
		{4, "8", "TORCHELASTIC_MAX_RESTARTS=2", false},
	} {
		env, warning := TorchrunDefaults(func(k string) string {
			if k == "OMP_NUM_THREADS" {
				return tc.omp
			}
			return ""
		}, tc.nproc, 2)
		if got := strings.Join(env, " "); got != tc.want || (warning != "") != tc.warning {
			t.Errorf("nproc %d, OMP_NUM_THREADS=%q: %q, warning %q; want %q, warning %v", tc.nproc, tc.omp, got, warning, tc.want, tc.warning)
		}
		if tc.warning && !strings.Contains(warning, "Setting OMP_NUM_THREADS environment variable for each process to be 1") {
			t.Errorf("warning %q is not torchrun's", warning)
		}
	}
}
