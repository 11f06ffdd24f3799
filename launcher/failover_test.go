package launcher

import (
	"strings"
	"testing"
	"time"
)

// One leader change is one line, however many switches the connection made
// while the election ran, and only once the new leader answered; a change
// that ends where it began says nothing.
func TestFailoverNoteOneLine(t *testing.T) {
	t0 := time.Date(2026, 12, 7, 22, 0, 0, 0, time.UTC)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	var f failoverNote
	if !f.switched("a:1", "why", at(0)) {
		t.Fatal("the first switch does not begin a change")
	}
	for i, to := range []string{"c:1", "b:1", "c:1"} { // the connection tries the replicas in turn
		if f.switched(to, "why", at(100*(i+1))) {
			t.Errorf("switch %d began another change", i)
		}
	}
	if line, ended := f.answered("b:1", at(0)); ended || line != "" {
		t.Errorf("an answer from before the change ended it: %q", line)
	}
	line, ended := f.answered("b:1", at(600))
	if !ended || line != "gotrain: the coordinator's leader moved to b:1 in 0.6 s (was a:1)" {
		t.Errorf("line %q (ended %v)", line, ended)
	}
	if n, why := f.summary(); n != 4 || why != "why" {
		t.Errorf("summary %d %q, want the change's 4 switches", n, why)
	}
	if line, ended := f.answered("b:1", at(700)); ended || line != "" {
		t.Errorf("a second line for the same change: %q", line)
	}
	// A blip: away and back to the same leader.
	f.switched("b:1", "why", at(1000))
	if line, ended := f.answered("b:1", at(1300)); !ended || line != "" {
		t.Errorf("a change back to the same leader: %q (ended %v), want no line", line, ended)
	}
	// The next change is a change again, and names no Raft term.
	f.switched("b:1", "why", at(2000))
	if line, _ := f.answered("c:1", at(3250)); !strings.HasPrefix(line, "gotrain: the coordinator's leader moved to c:1 in 1.2 s") || strings.Contains(line, "term") {
		t.Errorf("line %q", line)
	}
}
