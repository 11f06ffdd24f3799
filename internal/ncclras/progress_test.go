package ncclras

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func loadStatus(t *testing.T, name string) *Status {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	format := "text"
	if strings.HasSuffix(name, ".json") {
		format = "json"
	}
	st, err := ParseStatus(format, string(raw))
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return st
}

// formatViews writes views one rank a line, with times as offsets from t0.
func formatViews(t0 time.Time, vs []CommView) string {
	var b strings.Builder
	off := func(t time.Time) string {
		if t.IsZero() {
			return "-"
		}
		return "+" + t.Sub(t0).String()
	}
	for _, v := range vs {
		fmt.Fprintf(&b, "comm %s size=%d", v.Hash, v.Size)
		if v.Unknown {
			b.WriteString(" unknown")
		}
		b.WriteString("\n")
		for _, r := range v.Ranks {
			fmt.Fprintf(&b, "  rank=%d pid=%d gpu=%d/%d host=%s entered=%d completed=%d done-at=%s",
				r.Rank.Rank, r.Rank.Pid, r.Rank.CudaDev, r.Rank.NvmlDev, r.Rank.Host, r.Entered, r.Completed, off(r.CompletedAt))
			if r.Pending {
				fmt.Fprintf(&b, " pending=%q since=%s", r.PendingOp, off(r.PendingSince))
			}
			if r.Ambiguous {
				b.WriteString(" ambiguous")
			}
			if r.Stale {
				b.WriteString(" stale")
			}
			if r.Rank.Unresponsive {
				b.WriteString(" unresponsive")
			}
			if r.Error != "" {
				fmt.Fprintf(&b, " error=%q", r.Error)
			}
			b.WriteString("\n")
		}
	}
	return b.String()
}

// TestTracker feeds recorded reports, 2 s apart, through a Tracker and
// checks the progress it derives from the last one.
func TestTracker(t *testing.T) {
	for _, tc := range []struct {
		name    string
		reports []string
		want    string
	}{
		{"healthy json", []string{"healthy.json"}, `
comm e029a0dad4bf726e size=2
  rank=0 pid=579 gpu=0/0 host=192.0.2.2 entered=3 completed=3 done-at=-
  rank=1 pid=580 gpu=0/1 host=192.0.2.2 entered=3 completed=3 done-at=-
`},
		// NCCL 2.28.3 on 2 × H200: rank 1 skipped all-reduce #3 (bench/results/hang-2026-11-30-nccl.md).
		{"skip text", []string{"healthy.txt", "skip.txt"}, `
comm e029a0dad4bf726e size=2
  rank=0 pid=579 gpu=0/0 host=192.0.2.2 entered=3 completed=2 done-at=- pending="allreduce" since=+2s
  rank=1 pid=580 gpu=0/1 host=192.0.2.2 entered=2 completed=2 done-at=-
`},
		{"skip json", []string{"healthy.json", "skip.json"}, `
comm e029a0dad4bf726e size=2
  rank=0 pid=579 gpu=0/0 host=192.0.2.2 entered=4 completed=3 done-at=- pending="allreduce" since=+2s
  rank=1 pid=580 gpu=0/1 host=192.0.2.2 entered=3 completed=3 done-at=-
`},
		{"mismatch json", []string{"healthy.json", "mismatch.json"}, `
comm e029a0dad4bf726e size=2
  rank=0 pid=579 gpu=0/0 host=192.0.2.2 entered=4 completed=3 done-at=- pending="allreduce" since=+2s
  rank=1 pid=580 gpu=0/1 host=192.0.2.2 entered=4 completed=3 done-at=- pending="allgather" since=+2s
`},
		// Rank 1 stopped: RAS gets no answer from it; it keeps its last counts.
		{"stopped json", []string{"healthy.json", "skip.json", "stopped.json"}, `
comm e029a0dad4bf726e size=2
  rank=0 pid=579 gpu=0/0 host=192.0.2.2 entered=4 completed=3 done-at=- pending="allreduce" since=+2s
  rank=1 pid=580 gpu=0/1 host=192.0.2.2 entered=3 completed=3 done-at=- stale unresponsive
`},
		{"stopped json, never seen", []string{"stopped.json"}, `
comm e029a0dad4bf726e size=2 unknown
`},
		{"stopped text", []string{"skip.txt", "stopped.txt"}, `
comm e029a0dad4bf726e size=2
  rank=0 pid=579 gpu=0/0 host=192.0.2.2 entered=3 completed=2 done-at=- pending="allreduce" since=+0s stale
  rank=1 pid=580 gpu=0/1 host=192.0.2.2 entered=2 completed=2 done-at=- stale unresponsive
`},
		// Every rank launched all-reduce #4 and NCCL reports a remote error:
		// everybody waits in the agreed collective.
		{"async error", []string{"healthy.json", "error.json"}, `
comm e029a0dad4bf726e size=2
  rank=0 pid=579 gpu=0/0 host=192.0.2.2 entered=4 completed=3 done-at=+2s pending="" since=+2s error="NCCL error 6 (remote process error)"
  rank=1 pid=580 gpu=0/1 host=192.0.2.2 entered=4 completed=3 done-at=+2s pending="" since=+2s error="NCCL error 6 (remote process error)"
`},
		// 8 ranks: the text report names only the outlier; the 7 others are
		// one unnamed view, ahead in two functions.
		{"eight text", []string{"eight.txt"}, `
comm 00c0ffee12345678 size=8
  rank=-1 pid=-1 gpu=-1/-1 host= entered=43 completed=41 done-at=- pending="" since=+0s ambiguous
  rank=5 pid=7105 gpu=1/1 host=10.0.0.3 entered=41 completed=41 done-at=-
`},
		// The agreed count moves: completion time is the Tracker's clock.
		{"progress", []string{"healthy.json", "skip.json", "mismatch.json"}, `
comm e029a0dad4bf726e size=2
  rank=0 pid=579 gpu=0/0 host=192.0.2.2 entered=4 completed=3 done-at=- pending="allreduce" since=+2s
  rank=1 pid=580 gpu=0/1 host=192.0.2.2 entered=4 completed=3 done-at=- pending="allgather" since=+4s
`},
		{"subgroups", []string{"subgroup.json"}, `
comm e029a0dad4bf726e size=2
  rank=0 pid=579 gpu=0/0 host=192.0.2.2 entered=5 completed=5 done-at=-
  rank=1 pid=580 gpu=0/1 host=192.0.2.2 entered=5 completed=5 done-at=-
comm 0000000000000003 size=1
  rank=0 pid=579 gpu=0/0 host=192.0.2.2 entered=7 completed=7 done-at=-
`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t0 := time.Date(2026, 11, 30, 14, 0, 0, 0, time.UTC)
			tr := NewTracker()
			var vs []CommView
			for i, name := range tc.reports {
				vs = tr.Update(t0.Add(time.Duration(i)*2*time.Second), loadStatus(t, name))
			}
			if got := formatViews(t0, vs); got != strings.TrimPrefix(tc.want, "\n") {
				t.Errorf("got:\n%s\nwant:\n%s", got, strings.TrimPrefix(tc.want, "\n"))
			}
		})
	}
}

func TestTrackerForgets(t *testing.T) {
	tr := NewTracker()
	now := time.Now()
	tr.Update(now, loadStatus(t, "skip.txt"))
	// Healthy again: the text report no longer lists the communicator.
	if vs := tr.Update(now.Add(2*time.Second), loadStatus(t, "healthy.txt")); len(vs) != 0 || len(tr.comms) != 0 {
		t.Errorf("views %v, %d comms tracked; want none", vs, len(tr.comms))
	}
}

func TestParseJSONBad(t *testing.T) {
	for _, s := range []string{`{`, `{"communicators":[{"hash":"zz"}]}`} {
		if _, err := ParseJSON([]byte(s)); err == nil {
			t.Errorf("ParseJSON(%q): no error", s)
		}
	}
}

func FuzzStatus(f *testing.F) {
	for _, name := range []string{"skip.txt", "eight.txt", "stopped.txt", "skip.json", "stopped.json"} {
		raw, err := os.ReadFile(filepath.Join("testdata", name))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(string(raw))
	}
	f.Fuzz(func(t *testing.T, s string) {
		tr := NewTracker()
		tr.Update(time.Unix(0, 0), ParseText(s))
		if st, err := ParseJSON([]byte(s)); err == nil {
			tr.Update(time.Unix(2, 0), st)
		}
	})
}
