package relay

import (
	"os"
	"testing"
	"time"
)

func TestCPUSample(t *testing.T) {
	t0 := time.Unix(1000, 0)
	var c cpuSample
	if _, ok := c.next(7, 500, t0); ok {
		t.Fatal("a first sample gave a CPU use")
	}
	if pct, ok := c.next(7, 650, t0.Add(2*time.Second)); !ok || pct != 75 {
		t.Errorf("150 ticks in 2 s = %v, %v; want 75 %%", pct, ok)
	}
	if pct, ok := c.next(7, 850, t0.Add(3*time.Second)); !ok || pct != 200 {
		t.Errorf("two busy threads = %v, %v; want 200 %%", pct, ok)
	}
	if _, ok := c.next(8, 900, t0.Add(4*time.Second)); ok {
		t.Error("another process's ticks compared with the previous one's")
	}
	if _, ok := c.next(8, -1, t0.Add(5*time.Second)); ok {
		t.Error("unknown ticks gave a CPU use")
	}
	if _, ok := c.next(8, 950, t0.Add(6*time.Second)); ok {
		t.Error("a sample after an unknown one gave a CPU use")
	}
}

func TestCPUTicksOfThisProcess(t *testing.T) {
	before := cpuTicks(os.Getpid())
	if before < 0 {
		t.Fatal("this process's CPU ticks cannot be read")
	}
	// Work until the count moves (a loaded machine gives us less CPU).
	for deadline := time.Now().Add(time.Minute); cpuTicks(os.Getpid()) <= before; {
		if time.Now().After(deadline) {
			t.Fatalf("CPU ticks stay at %d after a minute of work", before)
		}
		for i := 0; i < 1e6; i++ {
			_ = i * i
		}
	}
	if cpuTicks(-5) != -1 {
		t.Error("a process that does not exist has CPU ticks")
	}
}
