package job

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

var rewrite = flag.Bool("rewrite", false, "rewrite testdata/*.txt with the actual output")

// TestInteraction runs the transcripts in testdata/. Each block is one command,
// a "----" line, and the expected output up to a blank line; lines starting
// with # between blocks are comments. Commands:
//
//	config [run=ID] [nodes=N] [max-restarts=N] [backoff=D] [rendezvous=D]  a new machine (before anything else)
//	join id=ID host=H [addr=A] [nproc=N] [gpus=N] [port=P] [pid=P]
//	lost id=ID [reason=TEXT]
//	exit id=ID gen=G rank=R [code=C] [signal=S] [pid=P] [tail=LINE|LINE]
//	park id=ID gen=G rank=R [pid=P]
//	barrier name=N gen=G rank=R waiter=W
//	cancel waiter=W
//	progress id=ID gen=G rank=R step=S [sps=X]
//	tick [d=DURATION]                                  advances the clock, then steps Tick
//	status
//
// Values with spaces are double-quoted Go strings. Run with -rewrite to
// regenerate the expected output. In StartGeneration, a rank marked * is a
// survivor.
func TestInteraction(t *testing.T) {
	files, err := filepath.Glob("testdata/*.txt")
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatal("no transcripts in testdata/")
	}
	for _, file := range files {
		t.Run(strings.TrimSuffix(filepath.Base(file), ".txt"), func(t *testing.T) {
			runTranscript(t, file)
		})
	}
}

type block struct {
	pre  []string // comments and blank lines before the command
	cmd  string
	line int
	want []string
}

func parseTranscript(t *testing.T, file string) (blocks []block, tail []string) {
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	var pre []string
	for i := 0; i < len(lines); i++ {
		l := lines[i]
		if strings.TrimSpace(l) == "" || strings.HasPrefix(l, "#") {
			pre = append(pre, l)
			continue
		}
		b := block{pre: pre, cmd: l, line: i + 1}
		pre = nil
		if i+1 >= len(lines) || lines[i+1] != "----" {
			t.Fatalf("%s:%d: command %q is not followed by ----", file, i+1, l)
		}
		i += 2
		for ; i < len(lines) && lines[i] != ""; i++ {
			b.want = append(b.want, lines[i])
		}
		blocks = append(blocks, b)
	}
	return blocks, pre
}

func runTranscript(t *testing.T, file string) {
	blocks, tail := parseTranscript(t, file)
	h := &harness{now: time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)}
	h.t0 = h.now
	var out strings.Builder
	for i, b := range blocks {
		got := h.run(b.cmd)
		if !*rewrite && strings.Join(got, "\n") != strings.Join(b.want, "\n") {
			t.Errorf("%s:%d: %s\n got:\n%s\nwant:\n%s", file, b.line, b.cmd, strings.Join(got, "\n"), strings.Join(b.want, "\n"))
		}
		for _, l := range b.pre {
			out.WriteString(l + "\n")
		}
		out.WriteString(b.cmd + "\n----\n")
		for _, l := range got {
			out.WriteString(l + "\n")
		}
		if i < len(blocks)-1 || len(tail) > 0 {
			out.WriteString("\n")
		}
	}
	for _, l := range tail {
		out.WriteString(l + "\n")
	}
	if *rewrite {
		if err := os.WriteFile(file, []byte(out.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

type harness struct {
	m       *Machine
	now, t0 time.Time
}

func (h *harness) run(cmd string) []string {
	name, args, err := parseCommand(cmd)
	if err != nil {
		return []string{"bad command: " + err.Error()}
	}
	if name == "config" {
		cfg := Config{RunID: args.str("run", "run-1"), Nodes: args.int("nodes", 0), MaxRestarts: args.int("max-restarts", 0)}
		backoff, err := time.ParseDuration(args.str("backoff", "0s"))
		if err != nil {
			return []string{"bad command: " + err.Error()}
		}
		cfg.RestartBackoff = backoff
		if cfg.RendezvousTimeout, err = time.ParseDuration(args.str("rendezvous", "0s")); err != nil {
			return []string{"bad command: " + err.Error()}
		}
		if err := hangConfig(&cfg, args); err != nil {
			return []string{"bad command: " + err.Error()}
		}
		m, err := New(cfg)
		if err != nil {
			return []string{"error: " + err.Error()}
		}
		h.m = m
		return append(args.unused(), "ok")
	}
	if h.m == nil {
		if m, err := New(Config{RunID: "run-1"}); err == nil {
			h.m = m
		}
	}
	var ev Event
	switch name {
	case "join":
		in := NodeInfo{
			Hostname: args.str("host", ""),
			Nproc:    args.int("nproc", 1),
			FreePort: args.int("port", 29500),
			AgentPID: args.int("pid", 100),
		}
		in.Address = args.str("addr", in.Hostname)
		for i := range args.int("gpus", 0) {
			in.GPUs = append(in.GPUs, GPU{Index: i, UUID: fmt.Sprintf("GPU-%s-%d", in.Hostname, i)})
		}
		ev = NodeJoined{NodeID: args.str("id", ""), Info: in}
	case "lost":
		ev = NodeLost{NodeID: args.str("id", ""), Reason: args.str("reason", "")}
	case "exit":
		var tail []string
		if s := args.str("tail", ""); s != "" {
			tail = strings.Split(s, "|")
		}
		ev = WorkerExited{
			NodeID:     args.str("id", ""),
			Generation: int64(args.int("gen", 0)),
			Rank:       args.int("rank", 0),
			Pid:        args.int("pid", 1000+args.int("rank", 0)),
			ExitCode:   args.int("code", 0),
			Signal:     args.str("signal", ""),
			StderrTail: tail,
		}
	case "park":
		ev = WorkerParked{
			NodeID:     args.str("id", ""),
			Generation: int64(args.int("gen", 0)),
			Rank:       args.int("rank", 0),
			Pid:        args.int("pid", 1000+args.int("rank", 0)),
		}
	case "barrier":
		ev = BarrierArrived{
			Name:       args.str("name", ""),
			Generation: int64(args.int("gen", 0)),
			Rank:       args.int("rank", 0),
			Waiter:     uint64(args.int("waiter", 0)),
		}
	case "cancel":
		ev = BarrierCanceled{Waiter: uint64(args.int("waiter", 0))}
	case "progress":
		sps, _ := strconv.ParseFloat(args.str("sps", "0"), 64)
		ev = ProgressReported{NodeID: args.str("id", ""), Ranks: []Progress{{
			Rank:             args.int("rank", 0),
			Generation:       int64(args.int("gen", 0)),
			Step:             int64(args.int("step", 0)),
			SamplesPerSecond: sps,
		}}}
	case "tick":
		d, err := time.ParseDuration(args.str("d", "1s"))
		if err != nil {
			return []string{"bad command: " + err.Error()}
		}
		h.now = h.now.Add(d)
		ev = Tick{}
	case "status":
		return append(args.unused(), h.status()...)
	case "report", "verdicts", "suspect", "evidence": // hang_test.go
		e, out := h.hangCommand(name, args)
		if e == nil {
			return append(args.unused(), out...)
		}
		ev = e
	default:
		return []string{"bad command: unknown command " + name}
	}
	out := args.unused()
	acts, err := h.m.Step(h.now, ev)
	if err != nil {
		return append(out, "error: "+err.Error())
	}
	if len(acts) == 0 {
		if d, ok := h.m.Deadline(); ok && h.m.state == StateWaiting {
			return append(out, fmt.Sprintf("ok (rendezvous ends at +%s)", d.Sub(h.t0)))
		} else if ok {
			return append(out, fmt.Sprintf("ok (next generation at +%s)", d.Sub(h.t0)))
		}
		return append(out, "ok")
	}
	for _, a := range acts {
		out = append(out, formatAction(a)...)
	}
	return out
}

func formatAction(a Action) []string {
	switch a := a.(type) {
	case StartGeneration:
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
	case EndGeneration:
		return append([]string{fmt.Sprintf("EndGeneration gen=%d reason=%q", a.Generation, a.Reason)}, formatFailure(a.Failure)...)
	case FinishJob:
		return append([]string{fmt.Sprintf("FinishJob succeeded=%t exit=%d message=%q", a.Succeeded, a.ExitCode, a.Message)}, formatFailure(a.Failure)...)
	case ReleaseBarrier:
		return []string{fmt.Sprintf("ReleaseBarrier name=%s gen=%d waiters=%v", a.Name, a.Generation, a.Waiters)}
	case HangDetected:
		return formatHang(a)
	case FailBarrier:
		return []string{fmt.Sprintf("FailBarrier name=%s gen=%d waiters=%v reason=%q", a.Name, a.Generation, a.Waiters, a.Reason)}
	}
	return []string{fmt.Sprintf("unknown action %T", a)}
}

func formatFailure(f *Failure) []string {
	if f == nil {
		return nil
	}
	return []string{fmt.Sprintf("  failure rank=%d node=%s host=%s pid=%d code=%d signal=%q reason=%q tail=%q",
		f.Rank, f.NodeID, f.Hostname, f.Pid, f.ExitCode, f.Signal, f.Reason, f.StderrTail)}
}

func (h *harness) status() []string {
	st := h.m.Status()
	out := []string{fmt.Sprintf("status run=%s state=%s gen=%d world=%d restarts=%d", st.RunID, st.State, st.Generation, st.WorldSize, st.RestartCount)}
	for _, n := range st.Nodes {
		out = append(out, fmt.Sprintf("  node %s group=%d host=%s addr=%s nproc=%d gpus=%d port=%d pid=%d",
			n.NodeID, n.GroupRank, n.Info.Hostname, n.Info.Address, n.Info.Nproc, len(n.Info.GPUs), n.Info.FreePort, n.Info.AgentPID))
	}
	for _, r := range st.Ranks {
		l := fmt.Sprintf("  rank %d node=%s host=%s local=%d state=%s code=%d signal=%q", r.Rank, r.NodeID, r.Hostname, r.LocalRank, r.State, r.ExitCode, r.Signal)
		if p := r.Progress; p != nil {
			l += fmt.Sprintf(" progress(gen=%d step=%d sps=%g received=+%s)", p.Generation, p.Step, p.SamplesPerSecond, p.Received.Sub(h.t0))
		}
		out = append(out, l)
	}
	return append(out, formatFailure(st.Failure)...)
}

// args are a command's key=value arguments; reading one marks it used.
type args map[string]*arg

type arg struct {
	val  string
	used bool
}

func (a args) str(k, def string) string {
	v, ok := a[k]
	if !ok {
		return def
	}
	v.used = true
	return v.val
}

func (a args) int(k string, def int) int {
	n, err := strconv.Atoi(a.str(k, strconv.Itoa(def)))
	if err != nil {
		return -999999 // shows up in the output
	}
	return n
}

// unused reports arguments the command did not read: typos in transcripts.
func (a args) unused() []string {
	var out []string
	for k, v := range a {
		if !v.used {
			out = append(out, "bad command: unknown argument "+k)
		}
	}
	slices.Sort(out)
	return out
}

func parseCommand(line string) (string, args, error) {
	name, rest, _ := strings.Cut(strings.TrimSpace(line), " ")
	a := args{}
	for rest = strings.TrimSpace(rest); rest != ""; rest = strings.TrimSpace(rest) {
		k, v, ok := strings.Cut(rest, "=")
		if !ok || strings.Contains(k, " ") {
			return "", nil, fmt.Errorf("want key=value at %q", rest)
		}
		if strings.HasPrefix(v, `"`) {
			q, err := strconv.QuotedPrefix(v)
			if err != nil {
				return "", nil, fmt.Errorf("argument %s: %w", k, err)
			}
			s, _ := strconv.Unquote(q)
			a[k], rest = &arg{val: s}, v[len(q):]
			continue
		}
		val, after, _ := strings.Cut(v, " ")
		a[k], rest = &arg{val: val}, after
	}
	return name, a, nil
}
