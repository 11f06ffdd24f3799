package job_test

import (
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/datadriven"

	"github.com/gotrain/gotrain/internal/coordinator/job"
	"github.com/gotrain/gotrain/internal/ncclras"
)

// TestInteraction runs the transcripts in testdata/ (datadriven's format: a
// command line, "----", the output it gives). Every file starts a fresh env
// whose clock stands at transcriptT0; run with -rewrite to regenerate the
// outputs. The commands are in [commands]; a rank marked * in
// StartGeneration is a survivor.
func TestInteraction(t *testing.T) {
	datadriven.Walk(t, "testdata", func(t *testing.T, path string) {
		e := &env{now: transcriptT0, ras: ncclras.NewTracker()}
		datadriven.RunTest(t, path, e.handle)
	})
}

// transcriptT0 is where a transcript's clock starts; times in transcripts
// (+D) are offsets from it.
var transcriptT0 = time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)

// env is one transcript's machine and clock.
type env struct {
	m   *job.Machine
	now time.Time
	ras *ncclras.Tracker // ras_test.go
}

type command struct {
	args string // the arguments it takes; any other is a typo and fails the test
	run  func(e *env, t *testing.T, d *datadriven.TestData) string
}

// commands of the transcripts. Values with spaces are written (like this);
// lists (a, b).
var commands = map[string]command{
	// A new machine; before anything else, else the first command makes one
	// with the defaults.
	// attach: the nodes count once their agents attach (reachable).
	"config": {"run nodes min-nodes node-timeout settle max-restarts backoff rendezvous hang-timeout on-hang attach", (*env).config},
	// coord: the node's agent runs the coordinator; node-rank: its
	// scheduler's node rank (order.go).
	// preflight: the node failed its preflight checks, saying this.
	"join":        {"id host addr nproc gpus port pid coord node-rank preflight", (*env).join},
	"lost":        {"id reason", (*env).lost},
	"unreachable": {"id reason", (*env).unreachable},
	"reachable":   {"id", (*env).reachable},
	"exit":        {"id gen rank code signal pid tail permanent repeated stopped", (*env).exit},
	"park":        {"id gen rank pid", (*env).park},
	"barrier":     {"name gen rank waiter", (*env).barrier},
	"cancel":      {"waiter", (*env).cancel},
	"progress":    {"id gen rank step sps", (*env).progress},
	// tick advances the clock (by 1s unless d is given), then steps Tick.
	"tick":   {"d", (*env).tick},
	"status": {"", (*env).status},
	// hang_test.go
	"report":   {"id gen rank pid state at comm entered completed done-at wait op dtype count root redop since error", (*env).report},
	"verdicts": {"", (*env).verdicts},
	"suspect":  {"", (*env).suspect},
	"evidence": {"id verdict rank kind text", (*env).evidence},
	// ras_test.go
	"ras": {"id gen file pids state", (*env).rasReport},
}

func (e *env) handle(t *testing.T, d *datadriven.TestData) string {
	c, ok := commands[d.Cmd]
	if !ok {
		d.Fatalf(t, "unknown command %q", d.Cmd)
	}
	for _, a := range d.CmdArgs {
		if !slices.Contains(strings.Fields(c.args), a.Key) {
			d.Fatalf(t, "%s takes [%s], not %s", d.Cmd, c.args, a.Key)
		}
	}
	if e.m == nil && d.Cmd != "config" {
		m, err := job.New(job.Config{RunID: "run-1"})
		if err != nil {
			t.Fatal(err)
		}
		e.m = m
	}
	out := c.run(e, t, d)
	e.m = restored(t, e.m)
	return out
}

// restored is m through its image as a replica's snapshot holds it (JSON):
// every transcript goes on after every command with the restored machine,
// so that a field the image lacks changes what a transcript prints.
func restored(t *testing.T, m *job.Machine) *job.Machine {
	t.Helper()
	b, err := json.Marshal(m.Image())
	if err != nil {
		t.Fatalf("the machine's image: %v", err)
	}
	var im job.Image
	if err := json.Unmarshal(b, &im); err != nil {
		t.Fatalf("the machine's image: %v", err)
	}
	r, err := job.FromImage(im)
	if err != nil {
		t.Fatalf("restore the machine's image: %v", err)
	}
	if !reflect.DeepEqual(r.Image(), m.Image()) {
		t.Fatalf("the restored machine differs:\n%+v\n%+v", r.Image(), m.Image())
	}
	return r
}

// step steps the machine at the env's clock and prints its actions, or "ok"
// and the deadline it waits for, or the error.
func (e *env) step(ev job.Event) string {
	acts, err := e.m.Step(e.now, ev)
	if err != nil {
		return "error: " + err.Error()
	}
	if len(acts) == 0 {
		d, ok := e.m.Deadline()
		switch {
		case !ok:
			return "ok"
		case e.m.Status().State == job.StateWaiting:
			return fmt.Sprintf("ok (rendezvous ends at +%s)", d.Sub(transcriptT0))
		default:
			return fmt.Sprintf("ok (next generation at +%s)", d.Sub(transcriptT0))
		}
	}
	var out []string
	for _, a := range acts {
		out = append(out, formatAction(a)...)
	}
	return strings.Join(out, "\n")
}

func (e *env) config(t *testing.T, d *datadriven.TestData) string {
	cfg := job.Config{RunID: "run-1"}
	d.MaybeScanArgs(t, "run", &cfg.RunID)
	d.MaybeScanArgs(t, "nodes", &cfg.Nodes)
	d.MaybeScanArgs(t, "min-nodes", &cfg.MinNodes)
	d.MaybeScanArgs(t, "node-timeout", &cfg.NodeTimeout)
	d.MaybeScanArgs(t, "settle", &cfg.JoinSettle)
	d.MaybeScanArgs(t, "max-restarts", &cfg.MaxRestarts)
	d.MaybeScanArgs(t, "backoff", &cfg.RestartBackoff)
	d.MaybeScanArgs(t, "rendezvous", &cfg.RendezvousTimeout)
	d.MaybeScanArgs(t, "hang-timeout", &cfg.HangTimeout)
	d.MaybeScanArgs(t, "on-hang", &cfg.OnHang)
	cfg.Attach = d.HasArg("attach")
	m, err := job.New(cfg)
	if err != nil {
		return "error: " + err.Error()
	}
	e.m = m
	return "ok"
}

func (e *env) join(t *testing.T, d *datadriven.TestData) string {
	var id string
	in := job.NodeInfo{Nproc: 1, FreePort: 29500, AgentPID: 100}
	d.ScanArgs(t, "id", &id)
	d.ScanArgs(t, "host", &in.Hostname)
	in.Address = in.Hostname
	d.MaybeScanArgs(t, "addr", &in.Address)
	d.MaybeScanArgs(t, "nproc", &in.Nproc)
	d.MaybeScanArgs(t, "port", &in.FreePort)
	d.MaybeScanArgs(t, "pid", &in.AgentPID)
	d.MaybeScanArgs(t, "preflight", &in.PreflightFailure)
	var gpus int
	d.MaybeScanArgs(t, "gpus", &gpus)
	for i := range gpus {
		in.GPUs = append(in.GPUs, job.GPU{Index: i, UUID: fmt.Sprintf("GPU-%s-%d", in.Hostname, i)})
	}
	ev := job.NodeJoined{NodeID: id, Info: in, Host: d.HasArg("coord"), NodeRank: -1}
	d.MaybeScanArgs(t, "node-rank", &ev.NodeRank)
	return e.step(ev)
}

func (e *env) lost(t *testing.T, d *datadriven.TestData) string {
	var ev job.NodeLost
	d.ScanArgs(t, "id", &ev.NodeID)
	d.MaybeScanArgs(t, "reason", &ev.Reason)
	return e.step(ev)
}

func (e *env) unreachable(t *testing.T, d *datadriven.TestData) string {
	var ev job.NodeUnreachable
	d.ScanArgs(t, "id", &ev.NodeID)
	d.MaybeScanArgs(t, "reason", &ev.Reason)
	return e.step(ev)
}

func (e *env) reachable(t *testing.T, d *datadriven.TestData) string {
	var ev job.NodeReachable
	d.ScanArgs(t, "id", &ev.NodeID)
	return e.step(ev)
}

func (e *env) exit(t *testing.T, d *datadriven.TestData) string {
	var ev job.WorkerExited
	d.ScanArgs(t, "id", &ev.NodeID)
	d.ScanArgs(t, "gen", &ev.Generation)
	d.ScanArgs(t, "rank", &ev.Rank)
	ev.Pid = 1000 + ev.Rank
	d.MaybeScanArgs(t, "pid", &ev.Pid)
	d.MaybeScanArgs(t, "code", &ev.ExitCode)
	d.MaybeScanArgs(t, "signal", &ev.Signal)
	d.MaybeScanArgs(t, "tail", &ev.StderrTail)
	d.MaybeScanArgs(t, "permanent", &ev.Permanent)
	ev.Repeated = d.HasArg("repeated")
	ev.Stopped = d.HasArg("stopped")
	return e.step(ev)
}

func (e *env) park(t *testing.T, d *datadriven.TestData) string {
	var ev job.WorkerParked
	d.ScanArgs(t, "id", &ev.NodeID)
	d.ScanArgs(t, "gen", &ev.Generation)
	d.ScanArgs(t, "rank", &ev.Rank)
	ev.Pid = 1000 + ev.Rank
	d.MaybeScanArgs(t, "pid", &ev.Pid)
	return e.step(ev)
}

func (e *env) barrier(t *testing.T, d *datadriven.TestData) string {
	var ev job.BarrierArrived
	d.ScanArgs(t, "name", &ev.Name)
	d.ScanArgs(t, "gen", &ev.Generation)
	d.ScanArgs(t, "rank", &ev.Rank)
	d.ScanArgs(t, "waiter", &ev.Waiter)
	return e.step(ev)
}

func (e *env) cancel(t *testing.T, d *datadriven.TestData) string {
	var ev job.BarrierCanceled
	d.ScanArgs(t, "waiter", &ev.Waiter)
	return e.step(ev)
}

func (e *env) progress(t *testing.T, d *datadriven.TestData) string {
	var id string
	var p job.Progress
	d.ScanArgs(t, "id", &id)
	d.ScanArgs(t, "gen", &p.Generation)
	d.ScanArgs(t, "rank", &p.Rank)
	d.ScanArgs(t, "step", &p.Step)
	d.MaybeScanArgs(t, "sps", &p.SamplesPerSecond)
	return e.step(job.ProgressReported{NodeID: id, Ranks: []job.Progress{p}})
}

func (e *env) tick(t *testing.T, d *datadriven.TestData) string {
	by := time.Second
	d.MaybeScanArgs(t, "d", &by)
	e.now = e.now.Add(by)
	return e.step(job.Tick{})
}

func (e *env) status(t *testing.T, d *datadriven.TestData) string {
	st := e.m.Status()
	out := []string{fmt.Sprintf("status run=%s state=%s gen=%d world=%d restarts=%d", st.RunID, st.State, st.Generation, st.WorldSize, st.RestartCount)}
	for _, n := range st.Nodes {
		out = append(out, fmt.Sprintf("  node %s group=%d host=%s addr=%s nproc=%d gpus=%d port=%d pid=%d",
			n.NodeID, n.GroupRank, n.Info.Hostname, n.Info.Address, n.Info.Nproc, len(n.Info.GPUs), n.Info.FreePort, n.Info.AgentPID))
	}
	for _, r := range st.Ranks {
		l := fmt.Sprintf("  rank %d node=%s host=%s local=%d state=%s code=%d signal=%q", r.Rank, r.NodeID, r.Hostname, r.LocalRank, r.State, r.ExitCode, r.Signal)
		if p := r.Progress; p != nil {
			l += fmt.Sprintf(" progress(gen=%d step=%d sps=%g received=+%s)", p.Generation, p.Step, p.SamplesPerSecond, p.Received.Sub(transcriptT0))
		}
		out = append(out, l)
	}
	return strings.Join(append(out, formatFailure(st.Failure)...), "\n")
}

func formatAction(a job.Action) []string {
	switch a := a.(type) {
	case job.StartGeneration:
		out := []string{fmt.Sprintf("StartGeneration gen=%d world=%d restarts=%d master=%s:%d",
			a.Generation, a.WorldSize, a.RestartCount, a.MasterAddr, a.MasterPort)}
		for _, n := range a.Nodes {
			var rs []string
			for _, r := range n.Ranks {
				s := fmt.Sprintf("%d/%d/%d", r.Rank, r.LocalRank, r.GPU)
				if r.Survivor {
					s += "*"
				}
				rs = append(rs, s)
			}
			out = append(out, fmt.Sprintf("  node %s group=%d rank/local/gpu=%s", n.NodeID, n.GroupRank, strings.Join(rs, " ")))
		}
		return out
	case job.EndGeneration:
		return append([]string{fmt.Sprintf("EndGeneration gen=%d reason=%q", a.Generation, a.Reason)}, formatFailure(a.Failure)...)
	case job.FinishJob:
		return append([]string{fmt.Sprintf("FinishJob succeeded=%t exit=%d message=%q", a.Succeeded, a.ExitCode, a.Message)}, formatFailure(a.Failure)...)
	case job.ReleaseBarrier:
		return []string{fmt.Sprintf("ReleaseBarrier name=%s gen=%d waiters=%v", a.Name, a.Generation, a.Waiters)}
	case job.HangDetected:
		return formatHang(a)
	case job.FailBarrier:
		return []string{fmt.Sprintf("FailBarrier name=%s gen=%d waiters=%v reason=%q", a.Name, a.Generation, a.Waiters, a.Reason)}
	case job.DropNode:
		return []string{fmt.Sprintf("DropNode node=%s host=%s reason=%q", a.NodeID, a.Hostname, a.Reason)}
	}
	return []string{fmt.Sprintf("unknown action %T", a)}
}

func formatFailure(f *job.Failure) []string {
	if f == nil {
		return nil
	}
	s := fmt.Sprintf("  failure rank=%d node=%s host=%s pid=%d code=%d signal=%q reason=%q tail=%q",
		f.Rank, f.NodeID, f.Hostname, f.Pid, f.ExitCode, f.Signal, f.Reason, f.StderrTail)
	if f.Permanent != "" {
		s += fmt.Sprintf(" permanent=%q", f.Permanent)
	}
	if f.Repeated {
		s += " repeated"
	}
	out := []string{s}
	for _, n := range f.Notes {
		out = append(out, "  note: "+n)
	}
	return out
}
