package launcher

import (
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/gotrain/gotrain/internal/jobenv"
	"github.com/gotrain/gotrain/internal/launcher/agentcore"
)

// The shell's measure of real processes: this test's process and a child,
// as ranks; a pid that is gone counts 0.
func TestStandbyMemoryMeasure(t *testing.T) {
	child := exec.Command("sleep", "600")
	if err := child.Start(); err != nil {
		t.Skipf("no sleep to run: %v", err)
	}
	t.Cleanup(func() { _ = child.Process.Kill(); _ = child.Wait() })
	gone := exec.Command("true")
	if err := gone.Run(); err != nil {
		t.Skipf("no true to run: %v", err)
	}

	ev := measureMemory([]int{os.Getpid(), child.Process.Pid, gone.Process.Pid}, nil)
	if ev.Err != "" {
		t.Fatalf("measureMemory: %s", ev.Err)
	}
	if ev.Total == 0 || ev.Available == 0 || ev.Available > ev.Total {
		t.Errorf("MemAvailable %d, MemTotal %d", ev.Available, ev.Total)
	}
	if len(ev.RSS) != 3 {
		t.Fatalf("RSS = %v, want 3 entries", ev.RSS)
	}
	if self := ev.RSS[0]; self < 1<<20 || self > ev.Total {
		t.Errorf("this process's RSS = %d bytes", self)
	}
	if ev.RSS[1] == 0 || ev.RSS[1] > ev.RSS[0] {
		t.Errorf("sleep's RSS = %d bytes (this process: %d)", ev.RSS[1], ev.RSS[0])
	}
	// A pid not reused yet by the time of the read is 0; a reused one is
	// some process's RSS, within the machine.
	if ev.RSS[2] > ev.Total {
		t.Errorf("a gone process's RSS = %d bytes", ev.RSS[2])
	}

	// Whatever this machine has: ranks as large as the whole memory never
	// fit, and --standby on does not look.
	if keep, line := agentcore.KeepStandbys(StandbyAuto, ev.Available, ev.Total, []uint64{ev.Total}); keep || line == "" {
		t.Errorf("auto with ranks of MemTotal: keep %v, line %q", keep, line)
	}
	if keep, _ := agentcore.KeepStandbys(StandbyOn, ev.Available, ev.Total, []uint64{ev.Total}); !keep {
		t.Error("on with ranks of MemTotal: not kept")
	}
}

// The machine and the shell together: under --standby auto, once the rank
// (this test's process) attached, the machine asks for the memory, and the
// shell's measure of this node decides as KeepStandbys says.
func TestStandbyMemoryDecision(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	m := agentcore.New(agentcore.Config{Grace: time.Second, StandbyTimeout: time.Minute, Standby: StandbyAuto,
		Node: jobenv.Node{AgentSocket: "/tmp/agent.sock", JobToken: "t", RunID: "r", Backend: "nccl", Host: "h"}})
	step := func(ev agentcore.Event) []agentcore.Action {
		acts, err := m.Step(now, ev)
		if err != nil {
			t.Fatal(err)
		}
		return acts
	}
	acts := step(agentcore.GenerationStarted{Gen: jobenv.NodeGeneration{Number: 1, WorldSize: 1,
		Ranks: []jobenv.Assignment{{Rank: 0, LocalRank: 0, GPU: 0}}}})
	if len(acts) != 1 {
		t.Fatalf("generation start: %v", acts)
	}
	spawn := acts[0].(agentcore.Spawn)
	step(agentcore.Spawned{Proc: spawn.Proc, Pid: os.Getpid()})
	acts = step(agentcore.Attached{Pid: os.Getpid(), Rank: 0, Generation: 1})
	if len(acts) != 1 {
		t.Fatalf("attached: %v, want one measure", acts)
	}
	measure, ok := acts[0].(agentcore.MeasureMemory)
	if !ok || len(measure.Pids) != 1 || measure.Pids[0] != os.Getpid() {
		t.Fatalf("attached: %v, want measure-memory of this process", acts)
	}
	ev := measureMemory(measure.Pids, measure.Standbys)
	keep, line := agentcore.KeepStandbys(StandbyAuto, ev.Available, ev.Total, ev.RSS)
	acts = step(ev)
	var standbys int
	var said string
	for _, a := range acts {
		switch a := a.(type) {
		case agentcore.SpawnStandby:
			standbys++
		case agentcore.Print:
			said = a.Text
		}
	}
	if keep && standbys != 1 || !keep && (standbys != 0 || said != line) {
		t.Errorf("measured %+v (keep %v): the machine did %v", ev, keep, acts)
	}
	t.Logf("this node: MemAvailable %d MiB of %d MiB, this process %d MiB: keep %v", ev.Available>>20, ev.Total>>20, ev.RSS[0]>>20, keep)
}
