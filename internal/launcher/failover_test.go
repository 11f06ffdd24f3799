package launcher

import (
	"strings"
	"testing"
	"time"
)

// One leader change is one line, however many switches the connection made
// while the election ran, and only once the target stayed put and a call
// there succeeded; a change back to the leader it had says nothing.
func TestFailoverNoteOneLine(t *testing.T) {
	t0 := time.Date(2026, 12, 7, 22, 0, 0, 0, time.UTC)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	var never time.Time
	var f failoverNote
	if !f.switched("a:1", "a:1 is unavailable", at(0)) {
		t.Fatal("the first switch does not begin a change")
	}
	// The connection tries the replicas in turn while the election runs.
	for i, from := range []string{"b:1", "c:1", "b:1"} {
		if f.switched(from, "no leader yet", at(100*(i+1))) {
			t.Errorf("switch %d began another change", i)
		}
	}
	for _, tc := range []struct {
		target   string
		ok, now  time.Time
		why      string
		line     string
		wantDone bool
	}{
		{"c:1", never, at(2000), "no call succeeded there", "", false},
		{"c:1", at(200), at(2000), "its success came before the last switch", "", false},
		{"c:1", at(400), at(500), "not settled: 200 ms after the last switch", "", false},
		{"c:1", at(600), at(900), "settled, and a call succeeded", "gotrain: the coordinator's leader moved to c:1 in 0.6 s (was a:1)", true},
		{"c:1", at(700), at(2000), "the change is over", "", false},
	} {
		line, done := f.settled(tc.target, tc.ok, tc.now)
		if line != tc.line || done != tc.wantDone {
			t.Errorf("%s: %q, %v; want %q, %v", tc.why, line, done, tc.line, tc.wantDone)
		}
	}
	if n, why := f.summary(); n != 4 || why != "no leader yet" {
		t.Errorf("summary %d %q, want the change's 4 switches", n, why)
	}
	// A blip: away from c:1 and back.
	f.switched("c:1", "probe timed out", at(3000))
	f.switched("a:1", "named by replica a:1", at(3100))
	if line, done := f.settled("c:1", at(3700), at(3700)); !done || line != "" {
		t.Errorf("back at the same leader: %q (ended %v), want no line", line, done)
	}
	// The next change names the leader announced last, and no Raft term.
	f.switched("c:1", "c:1 is unavailable", at(5000))
	if line, _ := f.settled("b:1", at(6250), at(6500)); !strings.HasPrefix(line, "gotrain: the coordinator's leader moved to b:1 in 1.2 s (was c:1)") || strings.Contains(line, "term") {
		t.Errorf("line %q", line)
	}
}

// The connection starts at the first address given, not at the leader it
// joined: finding that leader is no change of leader.
func TestFailoverNoteStartsAtJoinedLeader(t *testing.T) {
	t0 := time.Date(2026, 12, 7, 22, 0, 0, 0, time.UTC)
	var f failoverNote
	f.follow("b:1")
	f.follow("c:1") // the first one holds
	f.switched("a:1", "named by replica a:1", t0)
	if line, done := f.settled("b:1", t0.Add(time.Second), t0.Add(time.Second)); !done || line != "" {
		t.Errorf("finding the joined leader: %q (ended %v), want no line", line, done)
	}
}
