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

// The hub tells the agent's loop of every hello (with whether the worker
// recovers in process) and every stream's end, and finds a stream by pid
// until it ends.
func TestHubAttachHooks(t *testing.T) {
	h := newHub(slog.New(slog.DiscardHandler), nil, "node-1")
	type call struct {
		pid         int
		recoverable bool
		detached    bool
	}
	var calls []call
	h.onAttach = func(w *attachedWorker, rec bool) { calls = append(calls, call{pid: w.pid, recoverable: rec}) }
	h.onDetach = func(w *attachedWorker) { calls = append(calls, call{pid: w.pid, detached: true}) }
	h.started(3, 0, 100, 0)
	w0 := h.attach(&gotrainv1.WorkerHello{Rank: 0, Pid: 100, Generation: 3})
	if h.workerByPid(100) != w0 {
		t.Fatal("workerByPid does not find the attached stream")
	}
	h.rehello(w0, &gotrainv1.WorkerHello{Rank: 0, Pid: 100, Generation: 3, Recoverable: true})
	h.detach(w0)
	if h.workerByPid(100) != nil {
		t.Error("workerByPid finds a stream that ended")
	}
	want := []call{{pid: 100}, {pid: 100, recoverable: true}, {pid: 100, detached: true}}
	if len(calls) != len(want) {
		t.Fatalf("hooks %v, want %v", calls, want)
	}
	for i := range want {
		if calls[i] != want[i] {
			t.Errorf("hook %d = %+v, want %+v", i, calls[i], want[i])
		}
	}
}
