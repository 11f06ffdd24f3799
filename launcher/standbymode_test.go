package launcher

import (
	"log/slog"
	"strings"
	"testing"

	gotrainv1 "github.com/gotrain/gotrain/proto/gotrain/v1"
)

func TestParseStandbyMode(t *testing.T) {
	for in, want := range map[string]StandbyMode{"on": StandbyOn, "true": StandbyOn, "off": StandbyOff, "false": StandbyOff, "auto": StandbyAuto} {
		if got, err := ParseStandbyMode(in); err != nil || got != want {
			t.Errorf("ParseStandbyMode(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	if _, err := ParseStandbyMode("sometimes"); err == nil || !strings.Contains(err.Error(), "want on, off or auto") {
		t.Errorf("ParseStandbyMode(sometimes): %v", err)
	}
}

// auto keeps standbys on the NCCL backend only: on the CPU backend a spare
// saves little, and on is what a CPU job asks for explicitly.
func TestStandbyModeEnabled(t *testing.T) {
	for _, tc := range []struct {
		m       StandbyMode
		backend string
		want    bool
	}{
		{StandbyOn, "cpu", true}, {StandbyOn, "nccl", true},
		{StandbyAuto, "nccl", true}, {StandbyAuto, "cpu", false},
		{StandbyOff, "nccl", false}, {"", "nccl", false},
	} {
		if got := tc.m.enabled(tc.backend); got != tc.want {
			t.Errorf("%q.enabled(%s) = %t, want %t", tc.m, tc.backend, got, tc.want)
		}
	}
}

// allAttached holds once every worker of the generation said hello, even if
// one has detached since, and never for another generation; the hook runs
// on every attach.
func TestHubAllAttached(t *testing.T) {
	h := newHub(slog.New(slog.DiscardHandler), nil, "node-1")
	calls := 0
	h.onAttach = func() { calls++ }
	h.started(3, 0, 100, 0)
	h.started(3, 1, 101, 1)
	if h.allAttached(3, 2) {
		t.Fatal("allAttached before any hello")
	}
	w0 := h.attach(&gotrainv1.WorkerHello{Rank: 0, Pid: 100, Generation: 3})
	if h.allAttached(3, 2) {
		t.Fatal("allAttached with one of two workers attached")
	}
	h.detach(w0)
	h.attach(&gotrainv1.WorkerHello{Rank: 1, Pid: 101, Generation: 3})
	if !h.allAttached(3, 2) {
		t.Error("not allAttached after both said hello (one detached since)")
	}
	if h.allAttached(4, 2) || h.allAttached(3, 3) {
		t.Error("allAttached for another generation or more workers than started")
	}
	if calls != 2 {
		t.Errorf("onAttach ran %d times, want 2", calls)
	}
}
