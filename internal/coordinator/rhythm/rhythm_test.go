package rhythm_test

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/datadriven"

	"github.com/gotrain/gotrain/internal/coordinator/rhythm"
)

// TestTranscripts runs testdata/*.txt (datadriven; -rewrite regenerates
// the outputs). Commands:
//
//	pace [warmup=N min=N window=N mult=F floor=D]   a fresh Pace
//	advance seq=N at=+D [seen=+D]                    the lowest seq moved
//	restart                                          a new generation
//	timeout                                          what it gives now
//	judge [window=D min=N slower=F extra=D streak=N] a fresh Judge
//	observe                                          one sample a line:
//	  rank=R seq=N at=+D wait=D [recent=FIRST:D,D,...]
//
// Times +D are offsets from t0.
func TestTranscripts(t *testing.T) {
	datadriven.Walk(t, "testdata", func(t *testing.T, path string) {
		var p *rhythm.Pace
		var j *rhythm.Judge
		datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
			switch d.Cmd {
			case "pace":
				var c rhythm.PaceConfig
				d.MaybeScanArgs(t, "warmup", &c.Warmup)
				d.MaybeScanArgs(t, "min", &c.MinIntervals)
				d.MaybeScanArgs(t, "window", &c.Window)
				d.MaybeScanArgs(t, "mult", &c.Multiplier)
				if d.HasArg("floor") {
					c.Floor = dur(t, d, "floor")
				}
				p = rhythm.NewPace(c)
				return "ok"
			case "advance":
				var seq int64
				d.ScanArgs(t, "seq", &seq)
				reached := at(t, arg(t, d, "at"))
				seen := reached
				if d.HasArg("seen") {
					seen = at(t, arg(t, d, "seen"))
				}
				p.Advance(seq, reached, seen)
				return timeout(p)
			case "restart":
				p.Restart()
				return timeout(p)
			case "timeout":
				return timeout(p)
			case "judge":
				var c rhythm.JudgeConfig
				if d.HasArg("window") {
					c.Window = dur(t, d, "window")
				}
				d.MaybeScanArgs(t, "min", &c.MinCollectives)
				d.MaybeScanArgs(t, "slower", &c.Slower)
				if d.HasArg("extra") {
					c.MinExtra = dur(t, d, "extra")
				}
				d.MaybeScanArgs(t, "streak", &c.Streak)
				j = rhythm.NewJudge(c)
				return "ok"
			case "reset":
				j.Reset()
				return "ok"
			case "observe":
				var ss []rhythm.Sample
				for _, l := range strings.Split(strings.TrimSpace(d.Input), "\n") {
					ss = append(ss, sample(t, l))
				}
				f, ch := j.Observe(ss)
				return finding(f, ch)
			}
			t.Fatalf("unknown command %q", d.Cmd)
			return ""
		})
	})
}

var t0 = time.Date(2026, 12, 2, 0, 0, 0, 0, time.UTC)

func arg(t *testing.T, d *datadriven.TestData, k string) string {
	var s string
	d.ScanArgs(t, k, &s)
	return s
}

func dur(t *testing.T, d *datadriven.TestData, k string) time.Duration {
	v, err := time.ParseDuration(arg(t, d, k))
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func at(t *testing.T, s string) time.Time {
	v, err := time.ParseDuration(strings.TrimPrefix(s, "+"))
	if err != nil {
		t.Fatalf("time %q: %v", s, err)
	}
	return t0.Add(v)
}

func timeout(p *rhythm.Pace) string {
	p99, n := p.P99()
	d, ok := p.Timeout()
	if !ok {
		return fmt.Sprintf("intervals=%d p99=%s timeout=none", n, p99)
	}
	return fmt.Sprintf("intervals=%d p99=%s timeout=%s", n, p99, d)
}

func sample(t *testing.T, l string) rhythm.Sample {
	var s rhythm.Sample
	for _, f := range strings.Fields(l) {
		k, v, _ := strings.Cut(f, "=")
		var err error
		switch k {
		case "rank":
			s.Rank, err = strconv.Atoi(v)
		case "seq":
			s.Seq, err = strconv.ParseInt(v, 10, 64)
		case "at":
			s.At = at(t, v)
		case "wait":
			s.Wait, err = time.ParseDuration(v)
		case "recent":
			first, list, _ := strings.Cut(v, ":")
			s.RecentFirst, err = strconv.ParseInt(first, 10, 64)
			for _, w := range strings.Split(list, ",") {
				d, e := time.ParseDuration(w)
				if e != nil {
					err = e
				}
				s.RecentWaits = append(s.RecentWaits, d)
			}
		default:
			t.Fatalf("unknown sample field %q", k)
		}
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
	}
	return s
}

func finding(f rhythm.Finding, ch rhythm.Change) string {
	c := map[rhythm.Change]string{rhythm.Unchanged: "unchanged", rhythm.Named: "named", rhythm.Cleared: "cleared"}[ch]
	if f.Rank < 0 {
		return c + ": no straggler"
	}
	s := fmt.Sprintf("%s: rank %d slower=%.0f%% compute=%s others=%s collectives=%d", c, f.Rank, 100*f.Slower, f.Compute.Round(time.Millisecond), f.Others.Round(time.Millisecond), f.Collectives)
	if f.Common > 0 {
		s += fmt.Sprintf(" last=%.0f%% of %d", 100*f.LastShare, f.Common)
	}
	return s
}
