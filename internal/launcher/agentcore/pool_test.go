package agentcore

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gotrain/gotrain/internal/jobenv"
)

var t0 = time.Unix(1_000_000, 0)

// readyStandby puts a started, attached standby for slot on gpu into sp, as
// process proc with pid.
func readyStandby(t *testing.T, sp *standbyPool, slot, gpu int, proc ProcID, pid int) {
	t.Helper()
	if !sp.reserve(slot, gpu, proc) {
		t.Fatalf("slot %d: reserve refused", slot)
	}
	if sp.started(proc, pid, t0) {
		t.Fatalf("slot %d: started says kill", slot)
	}
	if err := sp.hello(slot, pid, uint64(pid)); err != nil {
		t.Fatal(err)
	}
}

func TestStandbyPoolTakeReadyStandbyOfTheSlotsGPU(t *testing.T) {
	sp := newStandbyPool(time.Second, false)
	readyStandby(t, sp, 0, 4, 1, 100)
	readyStandby(t, sp, 1, 5, 2, 101)

	if sp.reserve(0, 4, 3) {
		t.Error("a second standby for a slot that has one")
	}
	s, stale := sp.take(0, 4)
	if s == nil || s.proc != 1 || stale != nil || s.stream != 100 {
		t.Fatalf("take(0, 4) = %+v, %+v; want slot 0's standby", s, stale)
	}
	if s, _ := sp.take(0, 4); s != nil {
		t.Error("a standby was taken twice")
	}
	// The slot is free again: the agent starts the next one.
	if !sp.reserve(0, 4, 3) {
		t.Error("no new standby after the slot's was taken")
	}
	// Slot 1's GPU changed: its standby is stale and is not handed out.
	s, stale = sp.take(1, 6)
	if s != nil || stale == nil || stale.pid != 101 {
		t.Errorf("take(1, 6) = %+v, %+v; want no standby and pid 101 stale", s, stale)
	}
}

func TestStandbyPoolNotReadyIsNotTaken(t *testing.T) {
	sp := newStandbyPool(time.Second, false)
	sp.reserve(0, -1, 1)
	if s, _ := sp.take(0, -1); s != nil {
		t.Error("a standby still starting was taken")
	}
	sp.started(1, 7, t0)
	if s, _ := sp.take(0, -1); s != nil {
		t.Error("a standby that has not said hello was taken")
	}
	if err := sp.hello(0, 8, 1); err == nil {
		t.Error("hello from a pid that is not the slot's standby was accepted")
	}
	if err := sp.hello(1, 7, 1); err == nil {
		t.Error("hello for a slot without a standby was accepted")
	}
	if err := sp.hello(0, 7, 1); err != nil {
		t.Fatal(err)
	}
	// Its stream ended: not ready until it attaches again.
	sp.detached(0, 7, 1)
	if s, _ := sp.take(0, -1); s != nil {
		t.Error("a standby without a stream was taken")
	}
	_ = sp.hello(0, 7, 2)
	sp.detached(0, 7, 1) // the old stream's end comes late: no effect
	if s, _ := sp.take(0, -1); s == nil || s.stream != 2 {
		t.Error("the re-attached standby was not taken")
	}
}

func TestStandbyPoolExitOfAnUnusedStandbyIsReplaced(t *testing.T) {
	sp := newStandbyPool(time.Second, false)
	readyStandby(t, sp, 2, 3, 1, 50)
	got := sp.exited(1, "killed by SIGKILL")
	if !got.known || !got.replace || got.slot != 2 || got.gpu != 3 || got.warn != "" {
		t.Fatalf("exited = %+v; want a known standby of slot 2 / GPU 3 to replace, no warning", got)
	}
	if !sp.reserve(2, 3, 2) {
		t.Error("the slot is not free for the replacement")
	}
	// An exit the pool does not know (it killed the process) does nothing.
	if got := sp.exited(51, "exit status 1"); got.known {
		t.Errorf("exited(unknown) = %+v", got)
	}
}

func TestStandbyPoolTurnsOffWhenStandbysKeepDying(t *testing.T) {
	sp := newStandbyPool(time.Second, false)
	var last standbyExit
	for i := range maxStandbyDeaths {
		readyStandby(t, sp, 0, 0, ProcID(i+1), 10+i)
		last = sp.exited(ProcID(i+1), "exit status 1")
	}
	if last.replace || !strings.Contains(last.warn, "exited unused") {
		t.Fatalf("after %d deaths in a row: %+v; want off with a warning", maxStandbyDeaths, last)
	}
	if sp.reserve(0, 0, 99) {
		t.Error("a standby starts after the pool turned off")
	}

	// A standby used in between resets the count.
	sp = newStandbyPool(time.Second, false)
	for i := range 2 * maxStandbyDeaths {
		readyStandby(t, sp, 0, 0, ProcID(i+1), 10+i)
		if i%2 == 1 {
			if s, _ := sp.take(0, 0); s == nil {
				t.Fatal("take failed")
			}
			continue
		}
		if got := sp.exited(ProcID(i+1), "exit status 1"); !got.replace {
			t.Fatalf("death %d: %+v; want replace", i, got)
		}
	}
}

func TestStandbyPoolOffWhenTheProgramNeverSaysHello(t *testing.T) {
	for _, tc := range []struct {
		name string
		// end is how the silent standby (process 2) ends up; it returns the
		// processes to kill and the warning.
		end func(sp *standbyPool) (kill []ProcID, warn string)
	}{
		{"exits at once", func(sp *standbyPool) ([]ProcID, string) {
			got := sp.exited(2, "exit status 1")
			if got.replace {
				return nil, "replaced"
			}
			return nil, got.warn
		}},
		{"stays silent", func(sp *standbyPool) ([]ProcID, string) {
			if kill, warn := sp.tick(t0.Add(999 * time.Millisecond)); kill != nil || warn != "" {
				return nil, "off before the timeout"
			}
			return sp.tick(t0.Add(time.Second))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sp := newStandbyPool(time.Second, false)
			readyStandby(t, sp, 1, -1, 1, 21) // the other
			sp.reserve(0, -1, 2)
			sp.started(2, 20, t0)
			sp.reserve(2, -1, 3) // being started right now
			kill, warn := tc.end(sp)
			if !strings.Contains(warn, "worker library") || !strings.Contains(warn, "slot 0 (pid 20)") {
				t.Errorf("warning %q", warn)
			}
			if tc.name == "stays silent" && !slices.Equal(kill, []ProcID{2, 1}) && !slices.Equal(kill, []ProcID{1, 2}) {
				t.Errorf("kill = %v; want the silent standby and every other one", kill)
			}
			if !sp.started(3, 22, t0) {
				t.Error("a standby started after the pool turned off is kept")
			}
			if sp.reserve(0, -1, 4) {
				t.Error("a standby starts after the pool turned off")
			}
			// Only one warning, whatever happens next.
			if _, w := sp.tick(t0.Add(time.Hour)); w != "" {
				t.Errorf("second warning %q", w)
			}
			if err := sp.hello(1, 21, 5); err == nil || !strings.Contains(err.Error(), "off") {
				t.Errorf("hello after off: %v", err)
			}
		})
	}
}

func TestStandbyPoolStartFailureTurnsItOff(t *testing.T) {
	sp := newStandbyPool(time.Second, false)
	readyStandby(t, sp, 1, -1, 1, 31)
	sp.reserve(0, -1, 2)
	kill, warn := sp.startFailed(2, "fork: resource temporarily unavailable")
	if !slices.Equal(kill, []ProcID{1}) || !strings.Contains(warn, "could not be started") {
		t.Errorf("startFailed = %v, %q", kill, warn)
	}
}

func TestStandbyPoolCloseReturnsEveryStandby(t *testing.T) {
	sp := newStandbyPool(time.Second, false)
	readyStandby(t, sp, 0, -1, 1, 1)
	sp.reserve(1, -1, 2)
	sp.started(2, 2, t0)
	sp.reserve(2, -1, 3)
	kill := sp.close()
	if !slices.Equal(kill, []ProcID{1, 2}) {
		t.Errorf("close = %v; want both running standbys", kill)
	}
	if !sp.started(3, 3, t0) {
		t.Error("a standby that finished starting after close is kept")
	}
	if sp.reserve(0, -1, 4) {
		t.Error("reserve after close")
	}
	if got := sp.exited(1, "exit status 0"); got.known || got.replace {
		t.Errorf("exit after close: %+v", got)
	}
}

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
		if got := tc.m.Enabled(tc.backend); got != tc.want {
			t.Errorf("%q.Enabled(%s) = %t, want %t", tc.m, tc.backend, got, tc.want)
		}
	}
}

func TestLocalGPUs(t *testing.T) {
	g := jobenv.NodeGeneration{Ranks: []jobenv.Assignment{{Rank: 5, LocalRank: 1, GPU: 0}, {Rank: 4, LocalRank: 0, GPU: 2}}}
	if got := g.GPUs(); !slices.Equal(got, []int{2, 0}) {
		t.Errorf("GPUs = %v, want [2 0] (by local rank)", got)
	}
	cpu := jobenv.NodeGeneration{Ranks: []jobenv.Assignment{{Rank: 0, LocalRank: 0, GPU: -1}}}
	if got := cpu.GPUs(); got != nil {
		t.Errorf("GPUs of a CPU job = %v, want nil", got)
	}
	if got := standbyGPUs(0, []int{2, 0}); !slices.Equal(got, []int{2, 0}) {
		t.Errorf("standbyGPUs(0, [2 0]) = %v, want the node's list", got)
	}
	if got := standbyGPUs(3, []int{2, 0}); !slices.Equal(got, []int{3}) {
		t.Errorf("standbyGPUs(3, [2 0]) = %v, want [3] (not in the list)", got)
	}
	if got := standbyGPUs(3, nil); !slices.Equal(got, []int{3}) || standbyGPUs(-1, []int{2}) != nil {
		t.Errorf("standbyGPUs(3, nil) = %v, standbyGPUs(-1, [2]) = %v", got, standbyGPUs(-1, []int{2}))
	}
}
