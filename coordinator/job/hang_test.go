package job

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Transcript commands of the hang detector (see TestInteraction):
//
//	config ... [hang-timeout=D] [on-hang=report|restart] [straggler=D]
//	report id=ID gen=G rank=R [pid=P] [state=S] [at=+D]
//	       [comm=NAME entered=E completed=C [done-at=+D] [wait=D]
//	        [op=OP] [dtype=T] [count=N] [root=R] [redop=O] [since=+D] [error=TEXT]]
//	                        a rank's progress with one communicator; times are
//	                        offsets from the transcript's start. A rank with
//	                        entered > completed has collective completed+1
//	                        pending: op (default allreduce) entered at since.
//	verdicts                the verdicts in force
//	suspect                 what Diagnose would say now
//	evidence id=ID verdict=V rank=R kind=K text=T

// transcriptT0 is the harness's start time.
var transcriptT0 = time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)

func hangConfig(cfg *Config, a args) error {
	for _, f := range []struct {
		key string
		dst *time.Duration
	}{{"hang-timeout", &cfg.HangTimeout}, {"straggler", &cfg.StragglerThreshold}} {
		if s := a.str(f.key, ""); s != "" {
			d, err := time.ParseDuration(s)
			if err != nil {
				return err
			}
			*f.dst = d
		}
	}
	cfg.OnHang = a.str("on-hang", "")
	return nil
}

func (h *harness) offset(a args, key string, def time.Time) (time.Time, error) {
	s := a.str(key, "")
	if s == "" {
		return def, nil
	}
	d, err := time.ParseDuration(strings.TrimPrefix(s, "+"))
	if err != nil {
		return time.Time{}, err
	}
	return h.t0.Add(d), nil
}

func (h *harness) hangCommand(name string, a args) (Event, []string) {
	switch name {
	case "verdicts":
		var out []string
		for _, v := range h.m.Verdicts() {
			out = append(out, formatVerdict("Verdict", v)...)
		}
		if len(out) == 0 {
			out = []string{"no verdicts"}
		}
		return nil, out
	case "suspect":
		var out []string
		for _, v := range h.m.Suspected(h.now) {
			out = append(out, formatVerdict("Suspected", v)...)
		}
		if len(out) == 0 {
			out = []string{"nothing suspected"}
		}
		return nil, out
	case "evidence":
		return EvidenceReported{
			NodeID:    a.str("id", ""),
			VerdictID: int64(a.int("verdict", 0)),
			Evidence:  []Evidence{{Rank: a.int("rank", 0), Pid: 1000 + a.int("rank", 0), Kind: a.str("kind", "goroutines"), Text: a.str("text", "")}},
		}, nil
	}
	// report
	at, err := h.offset(a, "at", h.now)
	if err != nil {
		return nil, []string{"bad command: " + err.Error()}
	}
	rank := a.int("rank", 0)
	p := Progress{
		Rank:       rank,
		Generation: int64(a.int("gen", 0)),
		Time:       at,
		Pid:        a.int("pid", 1000+rank),
		ProcState:  a.str("state", "S"),
		Attached:   true,
	}
	if comm := a.str("comm", ""); comm != "" {
		c := CommProgress{
			Comm:         comm,
			EnteredSeq:   int64(a.int("entered", 0)),
			CompletedSeq: int64(a.int("completed", 0)),
			Error:        a.str("error", ""),
		}
		if c.CompletedTime, err = h.offset(a, "done-at", time.Time{}); err != nil {
			return nil, []string{"bad command: " + err.Error()}
		}
		if s := a.str("wait", ""); s != "" {
			if c.Wait, err = time.ParseDuration(s); err != nil {
				return nil, []string{"bad command: " + err.Error()}
			}
		}
		op := a.str("op", "allreduce")
		redop := ""
		if op == "allreduce" || op == "reducescatter" {
			redop = "sum"
		}
		pend := Collective{
			Seq: c.CompletedSeq + 1, Op: op, DType: a.str("dtype", "float32"), Count: int64(a.int("count", 1024)),
			Root: a.int("root", -1), ReduceOp: a.str("redop", redop), State: "started",
		}
		if pend.Enqueued, err = h.offset(a, "since", at); err != nil {
			return nil, []string{"bad command: " + err.Error()}
		}
		if c.Error != "" {
			pend.State = "failed"
			c.ErrorSeq = pend.Seq
		}
		if c.EnteredSeq > c.CompletedSeq {
			c.Pending = &pend
		}
		p.Comms = []CommProgress{c}
	}
	return ProgressReported{NodeID: a.str("id", ""), Ranks: []Progress{p}}, nil
}

func formatHang(a HangDetected) []string {
	out := formatVerdict("HangDetected", a.Verdict)
	if a.PostMortem {
		out[0] += " post-mortem"
	}
	for _, t := range a.Collect {
		out = append(out, fmt.Sprintf("  collect %s:%v", t.NodeID, t.Ranks))
	}
	return out
}

func formatVerdict(what string, v Verdict) []string {
	out := []string{
		fmt.Sprintf("%s id=%d kind=%s gen=%d comm=%s at=%q since=+%s detected=+%s waiting=%v",
			what, v.ID, v.Kind, v.Generation, v.Comm, seqName(v.Collective), v.Since.Sub(transcriptT0), v.Detected.Sub(transcriptT0), v.Waiting),
		"  summary: " + v.Summary,
	}
	for _, c := range v.Culprits {
		coll := "-"
		if c.Collective != nil {
			coll = seqName(*c.Collective)
		}
		out = append(out, fmt.Sprintf("  culprit rank=%d node=%s host=%s pid=%d gpu=%d/%s state=%s collective=%q",
			c.Rank, c.NodeID, c.Hostname, c.Pid, c.GPU, c.GPUUUID, strconv.Quote(c.ProcState), coll))
	}
	for _, d := range v.Details {
		out = append(out, "  detail: "+d)
	}
	for _, e := range v.Evidence {
		out = append(out, fmt.Sprintf("  evidence rank=%d pid=%d kind=%s text=%q", e.Rank, e.Pid, e.Kind, e.Text))
	}
	return out
}
