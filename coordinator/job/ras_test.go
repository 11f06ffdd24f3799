package job

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/gotrain/gotrain/internal/ncclras"
)

// Transcripts of PyTorch-style jobs: ranks that never attach, whose progress
// the agent derives from NCCL RAS reports (launcher/raspoll.go). They live in
// testdata/ras/ and add one command to the hang detector's:
//
//	ras id=ID gen=G file=F pids=RANK:PID,... [state=RANK:S,...]
//	        reads the RAS report internal/ncclras/testdata/F through one
//	        Tracker per transcript (at the harness's clock), maps RAS ranks
//	        to gotrain ranks by pid and reports them, unattached, for node ID.
//
// The mapping to CommProgress mirrors launcher/rasCommProgress, which
// launcher/raspoll_test.go checks on the wire.
func TestRASTranscripts(t *testing.T) {
	files, err := filepath.Glob("testdata/ras/*.txt")
	if err != nil || len(files) == 0 {
		t.Fatalf("no transcripts in testdata/ras/: %v", err)
	}
	for _, file := range files {
		t.Run(strings.TrimSuffix(filepath.Base(file), ".txt"), func(t *testing.T) {
			runRASTranscript(t, file)
		})
	}
}

func runRASTranscript(t *testing.T, file string) {
	blocks, tail := parseTranscript(t, file)
	h := &harness{now: transcriptT0, t0: transcriptT0}
	tr := ncclras.NewTracker()
	var out strings.Builder
	for i, b := range blocks {
		var got []string
		if strings.HasPrefix(b.cmd, "ras ") {
			got = h.rasCommand(tr, b.cmd)
		} else {
			got = h.run(b.cmd)
		}
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

func (h *harness) rasCommand(tr *ncclras.Tracker, cmd string) []string {
	_, a, err := parseCommand(cmd)
	if err != nil {
		return []string{"bad command: " + err.Error()}
	}
	name := a.str("file", "")
	raw, err := os.ReadFile(filepath.Join("..", "..", "internal", "ncclras", "testdata", name))
	if err != nil {
		return []string{"bad command: " + err.Error()}
	}
	format := "text"
	if strings.HasSuffix(name, ".json") {
		format = "json"
	}
	st, err := ncclras.ParseStatus(format, string(raw))
	if err != nil {
		return []string{"bad command: " + err.Error()}
	}
	byPid := map[int]int{}
	for _, kv := range strings.Split(a.str("pids", ""), ",") {
		r, pid, _ := strings.Cut(kv, ":")
		ri, err1 := strconv.Atoi(r)
		pi, err2 := strconv.Atoi(pid)
		if err1 != nil || err2 != nil {
			return []string{"bad command: pids=" + a.str("pids", "")}
		}
		byPid[pi] = ri
	}
	states := map[int]string{}
	for _, kv := range strings.Split(a.str("state", ""), ",") {
		if r, s, ok := strings.Cut(kv, ":"); ok {
			ri, _ := strconv.Atoi(r)
			states[ri] = s
		}
	}
	gen := int64(a.int("gen", 0))
	progress := map[int]*Progress{}
	for pid, r := range byPid {
		st := "S"
		if s, ok := states[r]; ok {
			st = s
		}
		progress[r] = &Progress{Rank: r, Generation: gen, Pid: pid, ProcState: st, Time: h.now, CommsSource: "nccl-ras"}
	}
	for _, v := range tr.Update(h.now, st) {
		for _, rv := range v.Ranks {
			r, ok := byPid[rv.Rank.Pid]
			if !ok || v.Unknown {
				continue
			}
			c := CommProgress{Comm: v.Hash, EnteredSeq: rv.Entered, CompletedSeq: rv.Completed, CompletedTime: rv.CompletedAt, Error: rv.Error}
			if rv.Error != "" {
				c.ErrorSeq = rv.Completed + 1
			}
			if rv.Pending && !rv.Ambiguous && (rv.PendingOp != "" || rv.Error != "") {
				c.Pending = &Collective{Seq: rv.Completed + 1, Op: rv.PendingOp, Root: -1, State: "enqueued", Enqueued: rv.PendingSince}
				if rv.Error != "" {
					c.Pending.State = "failed"
				}
			}
			progress[r].Comms = append(progress[r].Comms, c)
		}
	}
	ev := ProgressReported{NodeID: a.str("id", "")}
	for r := range len(h.m.ranks) {
		if p, ok := progress[r]; ok {
			ev.Ranks = append(ev.Ranks, *p)
		}
	}
	out := a.unused()
	acts, err := h.m.Step(h.now, ev)
	if err != nil {
		return append(out, "error: "+err.Error())
	}
	for _, act := range acts {
		out = append(out, formatAction(act)...)
	}
	if len(out) == 0 {
		out = []string{"ok"}
	}
	return out
}
