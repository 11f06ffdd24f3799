package jobenv

import (
	"strings"
	"testing"
)

func TestStandbyVarsRoundTrip(t *testing.T) {
	want := StandbyVars{Slot: 3, AgentSocket: "/tmp/a.sock", JobToken: "tok", RunID: "run", Backend: "nccl", Host: "10.0.0.1", GPU: 5}
	env := map[string]string{}
	for _, kv := range want.Environ() {
		k, v, _ := strings.Cut(kv, "=")
		env[k] = v
	}
	get := func(k string) string { return env[k] }
	if !IsStandby(get) {
		t.Fatal("not a standby")
	}
	got, err := StandbyFromEnv(get)
	if err != nil || got != want {
		t.Fatalf("StandbyFromEnv = %+v, %v; want %+v", got, err, want)
	}
	if _, err := FromEnv(get); err != ErrNotLaunched {
		t.Errorf("a standby's environment has a rank: FromEnv err = %v", err)
	}
	// An enclosing job's standby variables never reach a worker.
	if s := Strip([]string{Standby + "=1", StandbySlot + "=0", "HOME=/root"}); len(s) != 1 || s[0] != "HOME=/root" {
		t.Errorf("Strip kept %q", s)
	}
	delete(env, StandbySlot)
	if _, err := StandbyFromEnv(get); err == nil {
		t.Error("no error without the slot")
	}
}
