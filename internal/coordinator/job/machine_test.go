package job

import (
	"errors"
	"reflect"
	"testing"
	"time"
)

func TestConfigDefaults(t *testing.T) {
	m, err := New(Config{RunID: "r"})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := m.Config(), (Config{RunID: "r", Nodes: 1, MinNodes: 1, NodeTimeout: DefaultNodeTimeout, JoinSettle: DefaultJoinSettle, OnHang: OnHangReport,
		OnStraggler: OnStragglerReport, StragglerPersist: DefaultStragglerPersist, StragglerCooldown: DefaultStragglerCooldown}); got != want {
		t.Errorf("Config() = %+v, want %+v", got, want)
	}
	if _, err := New(Config{RunID: "r", Nodes: -2}); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("New(Nodes: -2) = %v, want ErrInvalidConfig", err)
	}
}

func TestExitCode(t *testing.T) {
	tests := []struct {
		name string
		f    Failure
		want int
	}{
		{"code", Failure{ExitCode: 3}, 3},
		{"SIGKILL", Failure{ExitCode: -1, Signal: "SIGKILL"}, 137},
		{"KILL", Failure{ExitCode: -1, Signal: "KILL"}, 137},
		{"go string", Failure{ExitCode: -1, Signal: "terminated"}, 143},
		{"number", Failure{ExitCode: -1, Signal: "6"}, 134},
		{"lowercase name", Failure{ExitCode: -1, Signal: "segv"}, 139},
		{"unknown signal", Failure{ExitCode: -1, Signal: "SIGNOPE"}, 1},
		{"signal beats code", Failure{ExitCode: 2, Signal: "SIGINT"}, 130},
		{"node lost", Failure{Reason: "gone"}, 1},
		{"negative code without signal", Failure{ExitCode: -1}, 1},
	}
	for _, tt := range tests {
		if got := exitCode(&tt.f); got != tt.want {
			t.Errorf("%s: exitCode(%+v) = %d, want %d", tt.name, tt.f, got, tt.want)
		}
	}
}

// A rejected event leaves the machine as it was.
func TestRejectedEventsChangeNothing(t *testing.T) {
	m, err := New(Config{RunID: "r", Nodes: 2})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(0, 0)
	step := func(ev Event) []Action {
		t.Helper()
		acts, err := m.Step(now, ev)
		if err != nil {
			t.Fatalf("Step(%+v): %v", ev, err)
		}
		return acts
	}
	step(NodeJoined{NodeID: "a", Info: NodeInfo{Hostname: "a", Address: "a", Nproc: 2, FreePort: 1}})
	step(NodeJoined{NodeID: "b", Info: NodeInfo{Hostname: "b", Address: "b", Nproc: 2, FreePort: 1}})
	step(BarrierArrived{Name: "x", Generation: 0, Rank: 0, Waiter: 1})
	before := m.Status()
	bad := []struct {
		ev   Event
		want error
	}{
		{NodeJoined{NodeID: "c", Info: NodeInfo{Hostname: "c", Address: "c", Nproc: 1, FreePort: 1}}, ErrJobStarted},
		{WorkerExited{NodeID: "a", Generation: 0, Rank: 2, ExitCode: 1}, ErrInvalidEvent},
		{WorkerExited{NodeID: "zz", Generation: 0, Rank: 0, ExitCode: 1}, ErrUnknownNode},
		{WorkerExited{NodeID: "a", Generation: 1, Rank: 0, ExitCode: 1}, ErrInvalidEvent},
		{BarrierArrived{Name: "x", Generation: 0, Rank: 1, Waiter: 1}, ErrInvalidEvent},
		{BarrierArrived{Name: "x", Generation: 0, Rank: 9, Waiter: 2}, ErrInvalidEvent},
		{ProgressReported{NodeID: "a", Ranks: []Progress{{Rank: 0, Generation: 0, Step: 5}, {Rank: 3, Generation: 0}}}, ErrInvalidEvent},
		{NodeLost{NodeID: "zz"}, ErrUnknownNode},
		{nil, ErrInvalidEvent},
	}
	for _, b := range bad {
		// Admit, which a replicated coordinator's leader asks before it
		// proposes, refuses the same events.
		if err := m.Admit(b.ev); !errors.Is(err, b.want) {
			t.Errorf("Admit(%+v) = %v, want %v", b.ev, err, b.want)
		}
		acts, err := m.Step(now, b.ev)
		if !errors.Is(err, b.want) || acts != nil {
			t.Errorf("Step(%+v) = %v, %v; want nil, %v", b.ev, acts, err, b.want)
		}
	}
	if after := m.Status(); !reflect.DeepEqual(before, after) {
		t.Errorf("status changed:\nbefore %+v\nafter  %+v", before, after)
	}
	// Admit takes what Step takes.
	for _, ev := range []Event{
		BarrierArrived{Name: "x", Generation: 0, Rank: 3, Waiter: 2},
		WorkerExited{NodeID: "a", Generation: 0, Rank: 1, ExitCode: 0},
		ProgressReported{NodeID: "b", Ranks: []Progress{{Rank: 2, Generation: 0, Step: 1}}},
		NodeLost{NodeID: "a"}, Tick{}, BarrierCanceled{Waiter: 99},
	} {
		if err := m.Admit(ev); err != nil {
			t.Errorf("Admit(%+v) = %v, want nil", ev, err)
		}
	}
	// The barrier still works: the rejected duplicate waiter did not count.
	acts := step(BarrierArrived{Name: "x", Generation: 0, Rank: 3, Waiter: 2})
	acts = append(acts, step(BarrierArrived{Name: "x", Generation: 0, Rank: 1, Waiter: 3})...)
	acts = append(acts, step(BarrierArrived{Name: "x", Generation: 0, Rank: 2, Waiter: 4})...)
	want := []Action{ReleaseBarrier{Name: "x", Generation: 0, Waiters: []uint64{1, 2, 3, 4}}}
	if !reflect.DeepEqual(acts, want) {
		t.Errorf("barrier actions = %+v, want %+v", acts, want)
	}
}

// Status shares no memory with the machine: callers may keep or change it.
func TestStatusIsACopy(t *testing.T) {
	m, err := New(Config{RunID: "r"})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(0, 0)
	info := NodeInfo{Hostname: "a", Address: "a", Nproc: 1, FreePort: 1, GPUs: []GPU{{Index: 0}}}
	if _, err := m.Step(now, NodeJoined{NodeID: "a", Info: info}); err != nil {
		t.Fatal(err)
	}
	info.GPUs[0].Index = 7 // the caller's slice is not the machine's
	prog := []Progress{{Rank: 0, Generation: 0, Comms: []CommProgress{{Comm: "world"}}}}
	if _, err := m.Step(now, ProgressReported{NodeID: "a", Ranks: prog}); err != nil {
		t.Fatal(err)
	}
	prog[0].Comms[0].Comm = "changed"
	st := m.Status()
	st.Nodes[0].Info.GPUs[0].Index = 9
	st.Ranks[0].Progress.Comms[0].Comm = "changed too"
	st = m.Status()
	if got := st.Nodes[0].Info.GPUs[0].Index; got != 0 {
		t.Errorf("GPU index = %d, want 0", got)
	}
	if got := st.Ranks[0].Progress.Comms[0].Comm; got != "world" {
		t.Errorf("comm = %q, want world", got)
	}
}
