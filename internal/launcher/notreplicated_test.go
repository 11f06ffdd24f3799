package launcher

import (
	"strings"
	"testing"
)

func TestNotReplicatedLine(t *testing.T) {
	for _, tc := range []struct {
		want  int
		given bool
		addr  string
		say   string
	}{
		{3, false, "127.0.0.1:29400", "the coordinator is not replicated (the job's 3 nodes would have 3): it listens on 127.0.0.1:29400, a loopback address"},
		{5, true, "[::1]:29400", "(--coordinator-replicas 5 asks for 5): it listens on [::1]:29400"},
		{3, false, "localhost:29400", "not replicated"},
		{1, false, "127.0.0.1:29400", ""},
		{3, false, "10.0.0.1:29400", ""},
	} {
		got := notReplicatedLine(tc.want, tc.given, tc.addr)
		if tc.say == "" && got != "" || tc.say != "" && !strings.Contains(got, tc.say) {
			t.Errorf("notReplicatedLine(%d, %v, %s) = %q, want %q", tc.want, tc.given, tc.addr, got, tc.say)
		}
	}
}
