package launcher

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestSnapshotPythonPath(t *testing.T) {
	for _, c := range []struct {
		env  []string
		dir  string
		want []string
	}{
		{[]string{"A=1"}, "", []string{"A=1"}},
		{[]string{"A=1"}, "/s/python", []string{"A=1", "PYTHONPATH=/s/python"}},
		{[]string{"PYTHONPATH=/mine", "A=1"}, "/s/python", []string{"PYTHONPATH=/mine:/s/python", "A=1"}},
		{[]string{"PYTHONPATH="}, "/s/python", []string{"PYTHONPATH=/s/python"}},
	} {
		in := slices.Clone(c.env)
		if got := snapshotPythonPath(in, c.dir); !slices.Equal(got, c.want) {
			t.Errorf("snapshotPythonPath(%q, %q) = %q, want %q", c.env, c.dir, got, c.want)
		}
		if !slices.Equal(in, c.env) {
			t.Errorf("the caller's env changed: %q", in)
		}
	}
}

// Only the process the agent started as a rank may keep that rank's
// snapshots: not another rank's worker, not a standby, not a stranger.
func TestAuthorizeSnapshots(t *testing.T) {
	c := newClaims()
	c.wait = 10 * time.Millisecond
	c.set(100, startedProc{rank: 2, gen: 1})
	c.set(200, startedProc{standby: true, slot: 0})
	ctx := context.Background()
	if err := c.authorizeSnapshots(ctx, 100, 2); err != nil {
		t.Errorf("rank 2's own worker: %v", err)
	}
	for _, tc := range []struct {
		pid, rank int
		want      string
	}{{100, 3, "rank 2"}, {200, 0, "standby"}, {999999, 2, "no worker"}} {
		if err := c.authorizeSnapshots(ctx, tc.pid, tc.rank); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("pid %d as rank %d: %v, want a refusal naming %q", tc.pid, tc.rank, err, tc.want)
		}
	}
}
