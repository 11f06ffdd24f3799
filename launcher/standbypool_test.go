package launcher

import (
	"errors"
	"strings"
	"testing"
	"time"

	gotrainv1 "github.com/gotrain/gotrain/proto/gotrain/v1"
)

var t0 = time.Unix(1_000_000, 0)

func fakeProc(pid int) *workerProc { return &workerProc{pidNum: pid, done: make(chan struct{})} }

// ready puts a started, attached standby for slot on gpu into sp.
func readyStandby(t *testing.T, sp *standbyPool, slot, gpu, pid int) (*workerProc, chan *gotrainv1.AgentMessage) {
	t.Helper()
	res := sp.reserve(slot, gpu)
	if res == nil {
		t.Fatalf("slot %d: reserve refused", slot)
	}
	p := fakeProc(pid)
	if sp.started(res, p, t0) {
		t.Fatalf("slot %d: started says kill", slot)
	}
	ch := make(chan *gotrainv1.AgentMessage, 1)
	if err := sp.hello(slot, pid, ch); err != nil {
		t.Fatal(err)
	}
	return p, ch
}

func TestStandbyPoolTakeReadyStandbyOfTheSlotsGPU(t *testing.T) {
	sp := newStandbyPool(time.Second)
	p0, ch0 := readyStandby(t, sp, 0, 4, 100)
	readyStandby(t, sp, 1, 5, 101)

	if sp.reserve(0, 4) != nil {
		t.Error("a second standby for a slot that has one")
	}
	s, stale := sp.take(0, 4)
	if s == nil || s.proc != p0 || stale != nil || s.send != ch0 {
		t.Fatalf("take(0, 4) = %+v, %+v; want slot 0's standby", s, stale)
	}
	if s, _ := sp.take(0, 4); s != nil {
		t.Error("a standby was taken twice")
	}
	// The slot is free again: the agent starts the next one.
	if sp.reserve(0, 4) == nil {
		t.Error("no new standby after the slot's was taken")
	}
	// Slot 1's GPU changed: its standby is stale and is not handed out.
	s, stale = sp.take(1, 6)
	if s != nil || stale == nil || stale.proc.pid() != 101 {
		t.Errorf("take(1, 6) = %+v, %+v; want no standby and pid 101 stale", s, stale)
	}
}

func TestStandbyPoolNotReadyIsNotTaken(t *testing.T) {
	sp := newStandbyPool(time.Second)
	res := sp.reserve(0, -1)
	if s, _ := sp.take(0, -1); s != nil {
		t.Error("a standby still starting was taken")
	}
	p := fakeProc(7)
	sp.started(res, p, t0)
	if s, _ := sp.take(0, -1); s != nil {
		t.Error("a standby that has not said hello was taken")
	}
	ch := make(chan *gotrainv1.AgentMessage, 1)
	if err := sp.hello(0, 8, ch); err == nil {
		t.Error("hello from a pid that is not the slot's standby was accepted")
	}
	if err := sp.hello(1, 7, ch); err == nil {
		t.Error("hello for a slot without a standby was accepted")
	}
	if err := sp.hello(0, 7, ch); err != nil {
		t.Fatal(err)
	}
	// Its stream ended: not ready until it attaches again.
	sp.detached(0, 7, ch)
	if s, _ := sp.take(0, -1); s != nil {
		t.Error("a standby without a stream was taken")
	}
	ch2 := make(chan *gotrainv1.AgentMessage, 1)
	_ = sp.hello(0, 7, ch2)
	sp.detached(0, 7, ch) // the old stream's end comes late: no effect
	if s, _ := sp.take(0, -1); s == nil || s.send != ch2 {
		t.Error("the re-attached standby was not taken")
	}
}

func TestStandbyPoolExitOfAnUnusedStandbyIsReplaced(t *testing.T) {
	sp := newStandbyPool(time.Second)
	p, _ := readyStandby(t, sp, 2, 3, 50)
	p.exit = exitInfo{code: -1, signal: 9}
	got := sp.exited(p)
	if !got.known || !got.replace || got.slot != 2 || got.gpu != 3 || got.warn != "" {
		t.Fatalf("exited = %+v; want a known standby of slot 2 / GPU 3 to replace, no warning", got)
	}
	if sp.reserve(2, 3) == nil {
		t.Error("the slot is not free for the replacement")
	}
	// An exit the pool does not know (it killed the process) does nothing.
	if got := sp.exited(fakeProc(51)); got.known {
		t.Errorf("exited(unknown) = %+v", got)
	}
}

func TestStandbyPoolTurnsOffWhenStandbysKeepDying(t *testing.T) {
	sp := newStandbyPool(time.Second)
	var last standbyExit
	for i := range maxStandbyDeaths {
		p, _ := readyStandby(t, sp, 0, 0, 10+i)
		last = sp.exited(p)
	}
	if last.replace || !strings.Contains(last.warn, "exited unused") {
		t.Fatalf("after %d deaths in a row: %+v; want off with a warning", maxStandbyDeaths, last)
	}
	if sp.reserve(0, 0) != nil {
		t.Error("a standby starts after the pool turned off")
	}

	// A standby used in between resets the count.
	sp = newStandbyPool(time.Second)
	for i := range 2 * maxStandbyDeaths {
		p, _ := readyStandby(t, sp, 0, 0, 10+i)
		if i%2 == 1 {
			if s, _ := sp.take(0, 0); s == nil {
				t.Fatal("take failed")
			}
			continue
		}
		if got := sp.exited(p); !got.replace {
			t.Fatalf("death %d: %+v; want replace", i, got)
		}
	}
}

func TestStandbyPoolOffWhenTheProgramNeverSaysHello(t *testing.T) {
	for _, tc := range []struct {
		name string
		// end is how the silent standby ends up; it returns the warning.
		end func(sp *standbyPool, p *workerProc) (kill []*workerProc, warn string)
	}{
		{"exits at once", func(sp *standbyPool, p *workerProc) ([]*workerProc, string) {
			got := sp.exited(p)
			if got.replace {
				return nil, "replaced"
			}
			return nil, got.warn
		}},
		{"stays silent", func(sp *standbyPool, p *workerProc) ([]*workerProc, string) {
			if kill, warn := sp.tick(t0.Add(999 * time.Millisecond)); kill != nil || warn != "" {
				return nil, "off before the timeout"
			}
			return sp.tick(t0.Add(time.Second))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sp := newStandbyPool(time.Second)
			other, _ := readyStandby(t, sp, 1, -1, 21)
			res := sp.reserve(0, -1)
			p := fakeProc(20)
			sp.started(res, p, t0)
			starting := sp.reserve(2, -1) // being started right now
			kill, warn := tc.end(sp, p)
			if !strings.Contains(warn, "worker library") || !strings.Contains(warn, "slot 0 (pid 20)") {
				t.Errorf("warning %q", warn)
			}
			for _, k := range kill {
				if k == other {
					other = nil
				}
			}
			if tc.name == "stays silent" && (len(kill) != 2 || kill[0] != p || other != nil) {
				t.Errorf("kill = %v; want the silent standby and every other one", kill)
			}
			if !sp.started(starting, fakeProc(22), t0) {
				t.Error("a standby started after the pool turned off is kept")
			}
			if sp.reserve(0, -1) != nil {
				t.Error("a standby starts after the pool turned off")
			}
			// Only one warning, whatever happens next.
			if _, w := sp.tick(t0.Add(time.Hour)); w != "" {
				t.Errorf("second warning %q", w)
			}
			if err := sp.hello(1, 21, make(chan *gotrainv1.AgentMessage)); err == nil || !strings.Contains(err.Error(), "off") {
				t.Errorf("hello after off: %v", err)
			}
		})
	}
}

func TestStandbyPoolStartFailureTurnsItOff(t *testing.T) {
	sp := newStandbyPool(time.Second)
	other, _ := readyStandby(t, sp, 1, -1, 31)
	res := sp.reserve(0, -1)
	kill, warn := sp.startFailed(res, errors.New("fork: resource temporarily unavailable"))
	if len(kill) != 1 || kill[0] != other || !strings.Contains(warn, "could not be started") {
		t.Errorf("startFailed = %v, %q", kill, warn)
	}
}

func TestStandbyPoolCloseReturnsEveryStandby(t *testing.T) {
	sp := newStandbyPool(time.Second)
	a, _ := readyStandby(t, sp, 0, -1, 1)
	res := sp.reserve(1, -1)
	b := fakeProc(2)
	sp.started(res, b, t0)
	starting := sp.reserve(2, -1)
	kill := sp.close()
	if len(kill) != 2 || kill[0] != a || kill[1] != b {
		t.Errorf("close = %v; want both running standbys", kill)
	}
	if !sp.started(starting, fakeProc(3), t0) {
		t.Error("a standby that finished starting after close is kept")
	}
	if sp.reserve(0, -1) != nil {
		t.Error("reserve after close")
	}
	if got := sp.exited(a); got.known || got.replace {
		t.Errorf("exit after close: %+v", got)
	}
}
