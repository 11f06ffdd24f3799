package agentcore_test

import (
	"fmt"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cockroachdb/datadriven"

	"github.com/gotrain/gotrain/internal/jobenv"
	"github.com/gotrain/gotrain/internal/launcher/agentcore"
)

// The transcripts in testdata/ drive a Machine with one command per event
// and print the actions it returns; -rewrite regenerates the expected
// output. Spawns are answered at once with pid 1000+ProcID, as the shell
// does, unless `fail-next-spawn` said otherwise; a memory measure is
// answered with what `memory` last said (by default, plenty).
//
// Commands:
//
//	new [grace=10s] [backend=cpu] [standby=off] [standby-timeout=30s] [python] [python-cold=TEXT] [no-restarts]
//	gen-start gen=N world=N [group=N] [restarts=N] [master=ADDR:PORT]
//	    one line per local rank: RANK LOCAL GPU [survivor]
//	gen-end gen=N [reason=TEXT]
//	job-finished [ok] [code=N] | coordinator-lost | cancel
//	exited p=N [code=N] [signal=NAME]
//	attached pid=N rank=N gen=N [recoverable] | detached pid=N
//	standby-hello slot=N pid=N [stream=N] | standby-detached slot=N pid=N [stream=N]
//	standby-unfit slot=N pid=N (the reason on the next line)
//	handover-failed p=N | fail-next-spawn (the error on the next line)
//	signal sig=NAME | tick [+=DURATION]
//	memory avail=MiB total=MiB rss=MiB (each rank's) [standby-rss=MiB (each standby's)] | memory error=TEXT
func TestInteraction(t *testing.T) {
	datadriven.Walk(t, "testdata", func(t *testing.T, path string) {
		h := &harness{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC),
			mem: agentcore.MemoryMeasured{Available: 64 << 30, Total: 128 << 30, RSS: []uint64{230 << 20}, StandbyRSS: []uint64{200 << 20}}}
		datadriven.RunTest(t, path, h.handle)
	})
}

type harness struct {
	m         *agentcore.Machine
	now       time.Time
	failSpawn string
	mem       agentcore.MemoryMeasured // RSS: each pid's
}

func (h *harness) handle(t *testing.T, d *datadriven.TestData) string {
	if d.Cmd != "new" && h.m == nil {
		d.Fatalf(t, "the first command must be new")
	}
	var ev agentcore.Event
	switch d.Cmd {
	case "new":
		cfg := agentcore.Config{Grace: 10 * time.Second, StandbyTimeout: 30 * time.Second, Standby: agentcore.StandbyOff,
			Node: jobenv.Node{AgentSocket: "/tmp/agent.sock", JobToken: "token", RunID: "run", Backend: "cpu", Host: "10.0.0.1"}}
		if d.HasArg("grace") {
			cfg.Grace = duration(t, d, "grace")
		}
		if d.HasArg("standby-timeout") {
			cfg.StandbyTimeout = duration(t, d, "standby-timeout")
		}
		if d.HasArg("backend") {
			d.ScanArgs(t, "backend", &cfg.Node.Backend)
		}
		if d.HasArg("standby") {
			var s string
			d.ScanArgs(t, "standby", &s)
			cfg.Standby = agentcore.StandbyMode(s)
		}
		cfg.Python, cfg.NoRestarts = d.HasArg("python"), d.HasArg("no-restarts")
		d.MaybeScanArgs(t, "python-cold", &cfg.PythonCold)
		h.m = agentcore.New(cfg)
		return ""
	case "gen-start":
		ev = agentcore.GenerationStarted{Gen: generation(t, d)}
	case "gen-end":
		e := agentcore.GenerationEnded{Reason: "a worker failed"}
		d.ScanArgs(t, "gen", &e.Generation)
		d.MaybeScanArgs(t, "reason", &e.Reason)
		if d.HasArg("replace") { // replace=(2, 3): ranks stopped even when they recover in process
			d.ScanArgs(t, "replace", &e.Replace)
		}
		ev = e
	case "job-finished":
		f := agentcore.JobFinished{Succeeded: d.HasArg("ok")}
		d.MaybeScanArgs(t, "code", &f.ExitCode)
		ev = f
	case "coordinator-lost":
		ev = agentcore.CoordinatorLost{Err: "stream broke"}
	case "cancel":
		ev = agentcore.Canceled{}
	case "exited":
		e := agentcore.Exited{Proc: proc(t, d)}
		d.MaybeScanArgs(t, "code", &e.Code)
		if d.HasArg("signal") {
			e.Code, e.Signal = -1, signal(t, d)
		}
		ev = e
	case "attached":
		e := agentcore.Attached{Recoverable: d.HasArg("recoverable")}
		d.ScanArgs(t, "pid", &e.Pid)
		d.ScanArgs(t, "rank", &e.Rank)
		d.ScanArgs(t, "gen", &e.Generation)
		ev = e
	case "detached":
		var e agentcore.Detached
		d.ScanArgs(t, "pid", &e.Pid)
		ev = e
	case "standby-hello":
		e := agentcore.StandbyHello{Stream: 1}
		d.ScanArgs(t, "slot", &e.Slot)
		d.ScanArgs(t, "pid", &e.Pid)
		d.MaybeScanArgs(t, "stream", &e.Stream)
		ev = e
	case "standby-detached":
		e := agentcore.StandbyDetached{Stream: 1}
		d.ScanArgs(t, "slot", &e.Slot)
		d.ScanArgs(t, "pid", &e.Pid)
		d.MaybeScanArgs(t, "stream", &e.Stream)
		ev = e
	case "standby-unfit":
		e := agentcore.StandbyUnfit{Reason: strings.TrimSpace(d.Input)}
		d.ScanArgs(t, "slot", &e.Slot)
		d.ScanArgs(t, "pid", &e.Pid)
		ev = e
	case "handover-failed":
		ev = agentcore.HandoverFailed{Proc: proc(t, d)}
	case "memory":
		var avail, total, rss, standbyRSS uint64
		d.MaybeScanArgs(t, "avail", &avail)
		d.MaybeScanArgs(t, "total", &total)
		d.MaybeScanArgs(t, "rss", &rss)
		d.MaybeScanArgs(t, "standby-rss", &standbyRSS)
		h.mem = agentcore.MemoryMeasured{Available: avail << 20, Total: total << 20, RSS: []uint64{rss << 20}, StandbyRSS: []uint64{standbyRSS << 20}}
		d.MaybeScanArgs(t, "error", &h.mem.Err)
		return ""
	case "fail-next-spawn":
		h.failSpawn = strings.TrimSpace(d.Input)
		return ""
	case "signal":
		ev = agentcore.Signaled{Sig: signal(t, d)}
	case "tick":
		if d.HasArg("+") {
			h.now = h.now.Add(duration(t, d, "+"))
		}
		ev = agentcore.Tick{}
	default:
		d.Fatalf(t, "unknown command %q", d.Cmd)
	}
	var b strings.Builder
	h.step(t, d, ev, &b, "")
	return b.String()
}

// step feeds ev through agentcore.Drive, the shell's loop, and prints the
// actions (those an answer caused indented under it), answering spawns and
// memory measures as the shell does.
func (h *harness) step(t *testing.T, d *datadriven.TestData, ev agentcore.Event, b *strings.Builder, indent string) {
	_, err := agentcore.Drive(h.m, func() time.Time { return h.now }, ev, func(depth int, a agentcore.Action) []agentcore.Event {
		in := indent + strings.Repeat("  ", depth)
		fmt.Fprintf(b, "%s%s\n", in, a)
		var id agentcore.ProcID
		switch a := a.(type) {
		case agentcore.MeasureMemory:
			ev := h.mem
			ev.RSS, ev.StandbyRSS = nil, nil
			for range a.Pids {
				ev.RSS = append(ev.RSS, h.mem.RSS[0])
			}
			for range a.Standbys {
				ev.StandbyRSS = append(ev.StandbyRSS, h.mem.StandbyRSS[0])
			}
			return []agentcore.Event{ev}
		case agentcore.Spawn:
			id = a.Proc
		case agentcore.SpawnStandby:
			id = a.Proc
		default:
			return nil
		}
		if h.failSpawn != "" {
			fmt.Fprintf(b, "%s  (spawn of p%d failed)\n", in, id)
			err := h.failSpawn
			h.failSpawn = ""
			return []agentcore.Event{agentcore.SpawnFailed{Proc: id, Err: err}}
		}
		return []agentcore.Event{agentcore.Spawned{Proc: id, Pid: 1000 + int(id)}}
	})
	if err != nil {
		d.Fatalf(t, "step: %v", err)
	}
}

func generation(t *testing.T, d *datadriven.TestData) jobenv.NodeGeneration {
	g := jobenv.NodeGeneration{MasterAddr: "10.0.0.1", MasterPort: 29500}
	d.ScanArgs(t, "gen", &g.Number)
	d.ScanArgs(t, "world", &g.WorldSize)
	d.MaybeScanArgs(t, "group", &g.GroupRank)
	d.MaybeScanArgs(t, "restarts", &g.RestartCount)
	for _, line := range strings.Split(strings.TrimSpace(d.Input), "\n") {
		f := strings.Fields(line)
		if len(f) < 3 {
			d.Fatalf(t, "rank line %q: want RANK LOCAL GPU [survivor]", line)
		}
		var n [3]int
		for i := range n {
			v, err := strconv.Atoi(f[i])
			if err != nil {
				d.Fatalf(t, "rank line %q: %v", line, err)
			}
			n[i] = v
		}
		g.Ranks = append(g.Ranks, jobenv.Assignment{Rank: n[0], LocalRank: n[1], GPU: n[2], Survivor: len(f) > 3 && f[3] == "survivor"})
	}
	return g
}

func proc(t *testing.T, d *datadriven.TestData) agentcore.ProcID {
	var p int
	d.ScanArgs(t, "p", &p)
	return agentcore.ProcID(p)
}

func duration(t *testing.T, d *datadriven.TestData, key string) time.Duration {
	var s string
	d.ScanArgs(t, key, &s)
	v, err := time.ParseDuration(s)
	if err != nil {
		d.Fatalf(t, "%s: %v", key, err)
	}
	return v
}

func signal(t *testing.T, d *datadriven.TestData) syscall.Signal {
	var s string
	if d.HasArg("sig") {
		d.ScanArgs(t, "sig", &s)
	} else {
		d.ScanArgs(t, "signal", &s)
	}
	for _, sig := range []syscall.Signal{syscall.SIGINT, syscall.SIGTERM, syscall.SIGKILL, syscall.SIGHUP, syscall.SIGUSR1, syscall.SIGUSR2, syscall.SIGSEGV, syscall.SIGABRT} {
		if agentcore.SignalName(sig) == "SIG"+s || agentcore.SignalName(sig) == s {
			return sig
		}
	}
	d.Fatalf(t, "unknown signal %q", s)
	return 0
}
