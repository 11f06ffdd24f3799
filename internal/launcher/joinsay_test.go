package launcher

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/gotrain/gotrain/internal/testing/testkit"
)

// The waiting line keeps its own clock: it comes every progressEvery while
// a try is still out (a replica set's connection can look for a leader
// longer than that), and stops when the join returns.
func TestSayWaitingOnItsOwnClock(t *testing.T) {
	defer func(d time.Duration) { progressEvery = d }(progressEvery)
	progressEvery = 20 * time.Millisecond
	var out testkit.Buffer
	a := &agent{cfg: Config{Stderr: &out, JoinTimeout: time.Minute}}
	stop := a.sayWaiting(context.Background(), "10.0.0.1:29400", func() string { return "" })
	testkit.WaitFor(t, time.Minute, "two waiting lines", func() bool { return strings.Count(out.String(), "\n") >= 2 })
	stop()
	said := out.String()
	for _, l := range strings.Split(strings.TrimSpace(said), "\n") {
		if !strings.HasPrefix(l, "gotrain: waiting for the coordinator at 10.0.0.1:29400 (") || !strings.HasSuffix(l, "so far, giving up after --join-timeout 1m0s)") {
			t.Errorf("waiting line %q", l)
		}
	}
	time.Sleep(5 * progressEvery)
	if out.String() != said {
		t.Errorf("a waiting line after stop: %q", strings.TrimPrefix(out.String(), said))
	}
}
