package observe

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	gotrainv1 "github.com/gotrain/gotrain/proto/gotrain/v1"
)

// fakeRAS serves NCCL's RAS client protocol on a loopback socket, answering
// STATUS with the fixture set last (internal/ncclras/testdata). With json
// false it refuses SET FORMAT json the way NCCL before 2.28 does.
type fakeRAS struct {
	addr string
	json bool

	mu      sync.Mutex
	fixture string
	queries int
}

func startFakeRAS(t *testing.T, json bool) *fakeRAS {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	f := &fakeRAS{addr: ln.Addr().String(), json: json}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go f.serve(t, c)
		}
	}()
	return f
}

func (f *fakeRAS) set(name string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.fixture = name
}

func (f *fakeRAS) serve(t *testing.T, c net.Conn) {
	defer c.Close()
	r := bufio.NewReader(c)
	format := "txt"
	for {
		l, err := r.ReadString('\n')
		if err != nil {
			return
		}
		switch l = strings.TrimSpace(l); {
		case strings.HasPrefix(l, "CLIENT PROTOCOL"):
			c.Write([]byte("SERVER PROTOCOL 2\n"))
		case strings.HasPrefix(l, "TIMEOUT"):
			c.Write([]byte("OK\n"))
		case strings.EqualFold(l, "SET FORMAT json") && f.json:
			format = "json"
			c.Write([]byte("OK\n"))
		case strings.EqualFold(l, "STATUS") || strings.EqualFold(l, "VERBOSE STATUS"):
			f.mu.Lock()
			name := f.fixture + "." + format
			f.queries++
			f.mu.Unlock()
			raw, err := os.ReadFile(filepath.Join("..", "..", "ncclras", "testdata", name))
			if err != nil {
				t.Errorf("fake RAS: %v", err)
				return
			}
			c.Write(raw)
			return
		default:
			c.Write([]byte("ERROR: Unknown command " + l + "\n"))
		}
	}
}

type fakeRanks struct {
	gen   int64
	ranks []RASRank
}

func (f *fakeRanks) RASRanks() (int64, []RASRank) { return f.gen, f.ranks }

// testPoller returns a poller of the fake's RAS with a clock the test moves.
func testPoller(t *testing.T, addr string, src RASSource, log *bytes.Buffer) (*RASPoller, *time.Time) {
	t.Helper()
	p := NewRASPoller(slog.New(slog.NewTextHandler(log, nil)), src, []string{"NCCL_RAS_ADDR=" + addr})
	now := time.Date(2026, 11, 30, 14, 0, 0, 0, time.UTC)
	p.now = func() time.Time { return now }
	p.parents = func(int) int { return 0 }
	p.local = func(string) bool { return false }
	p.Generation(0, 2)
	return p, &now
}

// report is what the relay's Hub.batch would send for rank r, in a stable text form.
func report(p *RASPoller, r int) string {
	rp := &gotrainv1.RankProgress{Rank: int32(r)}
	p.Annotate(0, r, rp)
	s := fmt.Sprintf("rank %d", rp.GetRank())
	for _, c := range rp.GetComms() {
		s += fmt.Sprintf(" comm=%s entered=%d completed=%d", c.GetComm(), c.GetEnteredSeq(), c.GetCompletedSeq())
		if pc := c.GetPending(); pc != nil {
			s += fmt.Sprintf(" pending=%s#%d/%s/root%d@%d", pc.GetOp(), pc.GetSeq(), pc.GetState(), pc.GetRoot(), pc.GetEnqueuedUnixNanos())
		}
		if c.GetError() != "" {
			s += fmt.Sprintf(" error=%q@%d", c.GetError(), c.GetErrorSeq())
		}
	}
	if rp.GetCommsSource() != "" {
		s += " source=" + rp.GetCommsSource()
	}
	if rp.GetCommsNote() != "" {
		s += fmt.Sprintf(" note=%q", rp.GetCommsNote())
	}
	return s
}

func TestRASPollSkip(t *testing.T) {
	for _, json := range []bool{true, false} {
		name := map[bool]string{true: "json", false: "text"}[json]
		t.Run(name, func(t *testing.T) {
			ras := startFakeRAS(t, json)
			src := &fakeRanks{ranks: []RASRank{{Rank: 0, Pid: 579, GPU: 0}, {Rank: 1, Pid: 580, GPU: 1}}}
			var log bytes.Buffer
			p, now := testPoller(t, ras.addr, src, &log)
			ctx := t.Context()

			ras.set("healthy")
			p.poll(ctx) // the ranks just started: RAS is not read yet
			if ras.queries != 0 {
				t.Fatalf("RAS read %d times before rasAfter", ras.queries)
			}
			*now = now.Add(rasAfter)
			p.poll(ctx)
			*now = now.Add(rasEvery)
			ras.set("skip")
			p.poll(ctx)
			got := report(p, 0) + "\n" + report(p, 1)
			since := now.UnixNano()
			want := fmt.Sprintf(`rank 0 comm=e029a0dad4bf726e entered=4 completed=3 pending=allreduce#4/enqueued/root-1@%d source=nccl-ras
rank 1 comm=e029a0dad4bf726e entered=3 completed=3 source=nccl-ras`, since)
			if !json { // the text report counts only the functions whose counts differ
				want = fmt.Sprintf(`rank 0 comm=e029a0dad4bf726e entered=3 completed=2 pending=allreduce#3/enqueued/root-1@%d source=nccl-ras
rank 1 comm=e029a0dad4bf726e entered=2 completed=2 source=nccl-ras`, since)
			}
			if got != want {
				t.Errorf("reports:\n%s\nwant:\n%s", got, want)
			}
			if !json && !strings.Contains(log.String(), "no JSON format") {
				t.Errorf("no word of the fallback to text in the log:\n%s", log.String())
			}
		})
	}
}

func TestRASPollMatch(t *testing.T) {
	ras := startFakeRAS(t, true)
	// Rank 0's worker is a shell (pid 100) whose child 579 runs NCCL; rank
	// 1's pid is not RAS's (another pid namespace): its GPU on this node
	// matches. Rank 2 attached: RAS is not read for it.
	src := &fakeRanks{ranks: []RASRank{{Rank: 0, Pid: 100, GPU: 0}, {Rank: 1, Pid: 9999, GPU: 1}, {Rank: 2, Pid: 581, GPU: 2, Attached: true}}}
	var log bytes.Buffer
	p, now := testPoller(t, ras.addr, src, &log)
	p.parents = func(pid int) int { return map[int]int{579: 100, 100: 1}[pid] }
	p.local = func(h string) bool { return h == "192.0.2.2" }
	ras.set("subgroup")
	p.poll(t.Context())
	*now = now.Add(rasAfter)
	p.poll(t.Context())
	// The single-rank communicator 0x3 is not the job's: left out.
	for r, want := range []string{
		`rank 0 comm=e029a0dad4bf726e entered=5 completed=5 source=nccl-ras`,
		`rank 1 comm=e029a0dad4bf726e entered=5 completed=5 source=nccl-ras`,
		`rank 2`,
	} {
		if got := report(p, r); got != want {
			t.Errorf("rank %d: %s\nwant: %s", r, got, want)
		}
	}
}

func TestRASPollUnreachable(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now
	src := &fakeRanks{ranks: []RASRank{{Rank: 0, Pid: 579, GPU: 0}}}
	var log bytes.Buffer
	p, now := testPoller(t, addr, src, &log)
	ctx := context.Background()
	for range 3 {
		p.poll(ctx)
		*now = now.Add(rasAfter)
	}
	if got := report(p, 0); got != "rank 0" {
		t.Errorf("before rasUnreachableAfter: %s", got)
	}
	for range 10 {
		*now = now.Add(rasUnreachableAfter / 4)
		p.poll(ctx)
	}
	want := `rank 0 note="not a gotrain worker and NCCL RAS unreachable at ` + addr + `"`
	if got := report(p, 0); got != want {
		t.Errorf("got %s\nwant %s", got, want)
	}
	if n := strings.Count(log.String(), "no collective-level view"); n != 1 {
		t.Errorf("the agent log says it %d times, want once:\n%s", n, log.String())
	}
	// RAS comes up (NCCL initialized late): the note goes.
	ras := startFakeRAS(t, true)
	ras.set("healthy")
	p.addr = ras.addr
	p.poll(ctx)
	if got := report(p, 0); got != "rank 0 comm=e029a0dad4bf726e entered=3 completed=3 source=nccl-ras" {
		t.Errorf("after RAS answers: %s", got)
	}
}
