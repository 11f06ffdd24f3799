package state_test

import (
	"encoding/json"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/datadriven"
	"google.golang.org/protobuf/proto"

	"github.com/gotrain/gotrain/internal/coordinator/job"
	"github.com/gotrain/gotrain/internal/coordinator/logentry"
	"github.com/gotrain/gotrain/internal/coordinator/state"
	"github.com/gotrain/gotrain/internal/preflight"
	gotrainv1 "github.com/gotrain/gotrain/proto/gotrain/v1"
)

// The transcripts (testdata/*.txt) feed one log to two replicas, a and b,
// as Raft would (each entry encoded, decoded by each), and print what a
// gave: the call's answer, then the effects. After every entry both
// replicas must hold equal states (Digest), or the transcript fails. b
// may be restarted from a's snapshot at any point (snapshot), and outboxes
// read from either (outbox on=b): a leader change is the other replica
// serving the same outbox.
//
//	config nodes=N [min=M] [peers=A,B] [want=W] [nproc-per-node=P] [ranks-per-job=R] [max-restarts=K]
//	join host=H [addr=A] [nproc=N] [pid=P] [port=F] [csr=X] [nnodes=K] [coord]
//	replica addr=A [node=N]
//	lost node=N [reason=R]
//	progress node=N
//	exit node=N gen=G rank=R code=C
//	kv key=K value=V
//	gang gen=G out=ID[,ID] [check=C]  (the gang check's verdict, as its leader puts it)
//	health host=H  (the node-health records of machine H on a, then b)
//	tick [d=DURATION]
//	outbox node=N [after=K] [on=a|b]
//	keys [on=a|b]
//	snapshot
var t0 = time.Date(2026, 12, 2, 8, 0, 0, 0, time.UTC)

type env struct {
	now  time.Time
	a, b *state.State
}

func TestTranscripts(t *testing.T) {
	datadriven.Walk(t, "testdata", func(t *testing.T, path string) {
		e := &env{now: t0}
		e.a, e.b = newState(t), newState(t)
		datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string { return e.handle(t, d) })
	})
}

func newState(t *testing.T) *state.State {
	st, err := state.New(job.Config{RunID: "own"})
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func arg(d *datadriven.TestData, key, def string) string {
	for _, a := range d.CmdArgs {
		if a.Key == key {
			if len(a.Vals) == 0 {
				return "true"
			}
			return strings.Join(a.Vals, ",")
		}
	}
	return def
}

func num(t *testing.T, d *datadriven.TestData, key string, def int) int {
	v := arg(d, key, "")
	if v == "" {
		return def
	}
	var n int
	if _, err := fmt.Sscan(v, &n); err != nil {
		d.Fatalf(t, "%s=%s: %v", key, v, err)
	}
	return n
}

func (e *env) handle(t *testing.T, d *datadriven.TestData) string {
	var pe *gotrainv1.LogEntry
	switch d.Cmd {
	case "config":
		c := state.Config{Job: job.Config{RunID: "run-1", Nodes: num(t, d, "nodes", 1), MinNodes: num(t, d, "min", 0), MaxRestarts: num(t, d, "max-restarts", 0)},
			Want: num(t, d, "want", 0), NprocPerNode: num(t, d, "nproc-per-node", 1024), RanksPerJob: num(t, d, "ranks-per-job", 65536)}
		if p := arg(d, "peers", ""); p != "" {
			c.Peers = strings.Split(p, ",")
		}
		pe = &gotrainv1.LogEntry{Entry: &gotrainv1.LogEntry_Config{Config: logentry.ConfigToProto(c)}}
	case "join":
		host := arg(d, "host", "h")
		n := &gotrainv1.NodeInfo{Hostname: host, Address: arg(d, "addr", host), Nproc: int32(num(t, d, "nproc", 1)), AgentPid: int32(num(t, d, "pid", 100)), FreePort: int32(num(t, d, "port", 29500))}
		req := &gotrainv1.JoinRequest{Node: n}
		if k := num(t, d, "nnodes", 0); k > 0 {
			req.Settings = &gotrainv1.JobSettings{Nodes: proto.Int32(int32(k))}
		}
		j := &gotrainv1.LogJoin{Request: req, Host: arg(d, "coord", "") != "", CsrSha256: []byte(arg(d, "csr", "c"))}
		// The pre-commit decision is the one apply makes again: print
		// when they differ (the state changed in between cannot happen
		// here: nothing comes between).
		admitted := e.a.Admit(logentry.JoinFromProto(req, j.Host, j.CsrSha256))
		out := e.apply(t, d, &gotrainv1.LogEntry{Entry: &gotrainv1.LogEntry_Join{Join: j}})
		if (admitted == nil) != !strings.HasPrefix(out, "error") {
			d.Fatalf(t, "Admit said %v, apply said %s", admitted, out)
		}
		// Its agent attaches (its first watch stream) at once, as agents
		// do, unless the join is pending: then "attach node=ID" does.
		if rest, ok := strings.CutPrefix(out, "joined "); ok && !d.HasArg("pending") {
			id := strings.Fields(rest)[0]
			a := e.apply(t, d, &gotrainv1.LogEntry{Entry: &gotrainv1.LogEntry_NodeReachable{NodeReachable: &gotrainv1.LogNode{NodeId: id}}})
			out += strings.TrimPrefix(strings.TrimPrefix(a, "ok"), "\n")
		}
		return out
	case "attach":
		pe = &gotrainv1.LogEntry{Entry: &gotrainv1.LogEntry_NodeReachable{NodeReachable: &gotrainv1.LogNode{NodeId: arg(d, "node", "")}}}
	case "replica":
		pe = &gotrainv1.LogEntry{Entry: &gotrainv1.LogEntry_Replica{Replica: &gotrainv1.LogReplica{Addr: arg(d, "addr", ""), NodeId: arg(d, "node", "")}}}
	case "lost":
		pe = &gotrainv1.LogEntry{Entry: &gotrainv1.LogEntry_NodeLost{NodeLost: &gotrainv1.LogNode{NodeId: arg(d, "node", ""), Reason: arg(d, "reason", "gone")}}}
	case "progress":
		pe = &gotrainv1.LogEntry{Entry: &gotrainv1.LogEntry_Progress{Progress: &gotrainv1.ReportProgressRequest{NodeId: arg(d, "node", "")}}}
	case "exit":
		pe = &gotrainv1.LogEntry{Entry: &gotrainv1.LogEntry_WorkerExit{WorkerExit: &gotrainv1.ReportWorkerExitRequest{NodeId: arg(d, "node", ""),
			Generation: int64(num(t, d, "gen", 0)), Rank: int32(num(t, d, "rank", 0)), ExitCode: int32(num(t, d, "code", 0))}}}
	case "kv":
		pe = &gotrainv1.LogEntry{Entry: &gotrainv1.LogEntry_KvPut{KvPut: &gotrainv1.KVPutRequest{Key: arg(d, "key", ""), Value: []byte(arg(d, "value", ""))}}}
	case "gang":
		var v preflight.GangVerdict
		for _, id := range strings.Split(arg(d, "out", ""), ",") {
			v.OutIDs = append(v.OutIDs, id)
			v.Out = append(v.Out, preflight.Verdict{Node: "as-the-leader-says", Check: preflight.Check(arg(d, "check", string(preflight.CheckGang))),
				Measured: "< 0.19 MB/s (2 nodes, 256 KiB)", Expected: "at least 10 MB/s"})
		}
		b, err := json.Marshal(v)
		if err != nil {
			d.Fatalf(t, "%v", err)
		}
		key := fmt.Sprintf("preflight/gang/%d/verdict", num(t, d, "gen", 0))
		pe = &gotrainv1.LogEntry{Entry: &gotrainv1.LogEntry_KvPut{KvPut: &gotrainv1.KVPutRequest{Key: key, Value: b}}}
	case "health":
		var b strings.Builder
		for _, st := range []*state.State{e.a, e.b} {
			for _, r := range st.HealthRecords(arg(d, "host", "")) {
				fmt.Fprintf(&b, "%s %s %s %q: %s\n", r.Time.Sub(t0), r.Host, r.Kind, r.Check, r.Detail)
			}
			b.WriteString("--\n")
		}
		return b.String()
	case "tick":
		dur, err := time.ParseDuration(arg(d, "d", "1s"))
		if err != nil {
			d.Fatalf(t, "%v", err)
		}
		e.now = e.now.Add(dur)
		pe = &gotrainv1.LogEntry{Entry: &gotrainv1.LogEntry_Tick{Tick: &gotrainv1.LogTick{}}}
	case "outbox":
		st := e.a
		if arg(d, "on", "a") == "b" {
			st = e.b
		}
		o := st.Outbox(arg(d, "node", ""))
		if o == nil {
			return "no outbox"
		}
		var b strings.Builder
		for _, ev := range o.Events[min(num(t, d, "after", 0), len(o.Events)):] {
			fmt.Fprintf(&b, "%d %s\n", ev.Seq, outString(ev))
		}
		if o.Closed {
			b.WriteString("closed\n")
		}
		return b.String()
	case "keys":
		st := e.a
		if arg(d, "on", "a") == "b" {
			st = e.b
		}
		var b strings.Builder
		for _, store := range []string{"k", "ncclcomm/x/0/id"} {
			keys := slices.Sorted(maps.Keys(st.Store(store).Entries()))
			if len(keys) == 0 {
				keys = []string{"(none)"}
			}
			fmt.Fprintf(&b, "%s\n", strings.Join(keys, " "))
		}
		return b.String()
	case "snapshot":
		snap, err := logentry.Snapshot(e.a)
		if err != nil {
			d.Fatalf(t, "%v", err)
		}
		b, err := logentry.Restore(snap, job.Config{RunID: "own"})
		if err != nil {
			d.Fatalf(t, "%v", err)
		}
		if b.Digest() != e.a.Digest() {
			d.Fatalf(t, "the restored state's digest differs from the snapshot's source")
		}
		// The digest sees the machine's status only; its tables must be
		// the same too, or the replicas step apart later.
		if ia, ib := e.a.Image(), b.Image(); !reflect.DeepEqual(ia, ib) {
			d.Fatalf(t, "the restored state's tables differ:\n%+v\n%+v", ia, ib)
		}
		e.b = b
		var held gotrainv1.StateSnapshot
		if err := proto.Unmarshal(snap, &held); err != nil {
			d.Fatalf(t, "%v", err)
		}
		return fmt.Sprintf("b restored from a's snapshot of %d entries applied; digests equal", held.GetApplied())
	default:
		d.Fatalf(t, "unknown command %q", d.Cmd)
	}
	return e.apply(t, d, pe)
}

// apply encodes pe at the env's time, applies it to both replicas and
// prints a's answer and effects.
func (e *env) apply(t *testing.T, d *datadriven.TestData, pe *gotrainv1.LogEntry) string {
	raw, err := logentry.Marshal(logentry.Stamp(pe, e.now))
	if err != nil {
		d.Fatalf(t, "%v", err)
	}
	var out string
	for i, st := range []*state.State{e.a, e.b} {
		en, err := logentry.Decode(raw)
		if err != nil {
			d.Fatalf(t, "%v", err)
		}
		r, effects := st.Apply(en)
		if i == 0 {
			out = e.show(r, effects)
		}
	}
	if e.a.Digest() != e.b.Digest() {
		d.Fatalf(t, "the replicas differ after this entry")
	}
	return out
}

func (e *env) show(r state.Result, effects []state.Effect) string {
	var b strings.Builder
	switch {
	case r.Err != nil:
		fmt.Fprintf(&b, "error: %v\n", r.Err)
	case r.Join.ID != "":
		fmt.Fprintf(&b, "joined %s", r.Join.ID)
		if r.Join.HostReplica {
			b.WriteString(" (asked to host a replica)")
		}
		b.WriteString("\n")
		for _, w := range r.Join.Warnings {
			fmt.Fprintf(&b, "warning: %s\n", w)
		}
	default:
		b.WriteString("ok\n")
	}
	var woken []string
	for _, ef := range effects {
		switch ef := ef.(type) {
		case state.Wake:
			if !slices.Contains(woken, ef.Node) {
				woken = append(woken, ef.Node)
			}
		case state.Drop:
			fmt.Fprintf(&b, "drop %s: %s\n", ef.Node, ef.Reason)
		case state.Answer:
			fmt.Fprintf(&b, "answer waiter %d %q\n", ef.Waiter, ef.Failed)
		case state.ArmDeadline:
			fmt.Fprintf(&b, "arm deadline +%s\n", ef.At.Sub(t0))
		case state.RemoveVoters:
			b.WriteString("remove voters\n")
		case state.Finish:
			fmt.Fprintf(&b, "finish succeeded=%v exit=%d\n", ef.Result.Succeeded, ef.Result.ExitCode)
		case state.Heard:
			fmt.Fprintf(&b, "heard %s\n", ef.Node)
		case state.KeyPut:
			fmt.Fprintf(&b, "key put %s\n", ef.Key)
		case state.Log:
			fmt.Fprintf(&b, "log %s %q", []string{"debug", "info", "warn", "error"}[ef.Level], ef.Msg)
			for i := 0; i+1 < len(ef.Args); i += 2 {
				if k := ef.Args[i]; k == "master" || k == "hostname" || k == "node_id" || k == "addr" || k == "replicas" || k == "generation" || k == "world_size" {
					fmt.Fprintf(&b, " %v=%v", k, ef.Args[i+1])
				}
			}
			b.WriteString("\n")
		}
	}
	if len(woken) > 0 {
		fmt.Fprintf(&b, "wake %s\n", strings.Join(woken, " "))
	}
	return b.String()
}

func outString(o state.Out) string {
	switch {
	case o.Started != nil:
		return fmt.Sprintf("started gen=%d world=%d restarts=%d", o.Started.Generation, o.Started.WorldSize, o.Started.RestartCount)
	case o.Ended != nil:
		return fmt.Sprintf("ended gen=%d: %s", o.Ended.Generation, o.Ended.Reason)
	case o.Restarting != nil:
		return fmt.Sprintf("restarting attempt %d of %d in %s", o.Restarting.Attempt, o.Restarting.MaxAttempts, o.Restarting.Wait)
	case o.Finished != nil:
		return fmt.Sprintf("finished succeeded=%v exit=%d", o.Finished.Succeeded, o.Finished.ExitCode)
	case o.Replicas != nil:
		return fmt.Sprintf("replicas %s", strings.Join(o.Replicas, ","))
	case o.HostReplica:
		return "host a replica"
	case o.Evidence != nil:
		return fmt.Sprintf("evidence verdict %d ranks %v", o.Evidence.Verdict.ID, o.Evidence.Ranks)
	}
	return "?"
}
