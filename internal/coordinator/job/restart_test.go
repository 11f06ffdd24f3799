package job

import (
	"slices"
	"testing"
	"time"
)

// The pause for a failure that repeats before any progress doubles from the
// second repeat and stops growing at RepeatBackoffMax.
func TestRepeatBackoff(t *testing.T) {
	for n, want := range map[int]time.Duration{0: 0, 1: 0, 2: time.Second, 3: 2 * time.Second, 4: 4 * time.Second,
		6: 16 * time.Second, 7: RepeatBackoffMax, 60: RepeatBackoffMax, 1 << 20: RepeatBackoffMax} {
		if got := repeatBackoff(n); got != want {
			t.Errorf("repeatBackoff(%d) = %s, want %s", n, got, want)
		}
	}
}

// RestartCountBase (a Slurm requeue's SLURM_RESTART_COUNT) starts the
// restart count every generation and Status report; MaxRestarts still
// counts only this run's restarts.
func TestRestartCountBase(t *testing.T) {
	m, err := New(Config{RunID: "r", MaxRestarts: 1, RestartCountBase: 2})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(0, 0)
	var counts []int
	step := func(ev Event) {
		t.Helper()
		acts, err := m.Step(now, ev)
		if err != nil {
			t.Fatal(err)
		}
		for _, a := range acts {
			if sg, ok := a.(StartGeneration); ok {
				counts = append(counts, sg.RestartCount)
			}
		}
	}
	step(NodeJoined{NodeID: "a", Info: NodeInfo{Hostname: "a", Address: "a", Nproc: 1, FreePort: 1}})
	for gen := int64(0); gen < 3 && m.Status().State == StateRunning; gen++ {
		step(WorkerExited{NodeID: "a", Generation: gen, Rank: 0, Pid: 1, ExitCode: 1})
		now = now.Add(time.Minute)
		step(Tick{})
	}
	if want := []int{2, 3}; !slices.Equal(counts, want) {
		t.Errorf("restart counts of the generations = %v, want %v (base 2, one restart allowed)", counts, want)
	}
	if got := m.Status().RestartCount; got != 3 {
		t.Errorf("Status().RestartCount = %d, want 3", got)
	}
	if _, err := New(Config{RunID: "r", RestartCountBase: -1}); err == nil {
		t.Error("a negative RestartCountBase was accepted")
	}
}
