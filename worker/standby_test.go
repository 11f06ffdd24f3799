package worker

import (
	"maps"
	"testing"

	"github.com/gotrain/gotrain/internal/jobenv"
)

func TestAdoptEnvSetsTheRanksVariablesAndDropsTheStandbys(t *testing.T) {
	env := map[string]string{jobenv.Standby: "1", jobenv.StandbySlot: "1", "HOME": "/root", "RANK": "stale"}
	set := func(k, v string) error { env[k] = v; return nil }
	unset := func(k string) error { delete(env, k); return nil }
	if err := adoptEnv([]string{"RANK=3", "GOTRAIN_RANK=3", "MASTER_ADDR=a=b"}, set, unset); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"HOME": "/root", "RANK": "3", "GOTRAIN_RANK": "3", "MASTER_ADDR": "a=b"}
	if !maps.Equal(env, want) {
		t.Errorf("env = %v, want %v", env, want)
	}
	if err := adoptEnv([]string{"NOEQUALS"}, set, unset); err == nil {
		t.Error("a variable without = was accepted")
	}
}
