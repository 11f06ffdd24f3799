package worker

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"
)

// When the agent says the generation ended and the process is not in Run,
// abortAll aborts every communicator the process made: a collective waiting
// for a peer that will never come fails at once instead of holding the
// program until the SIGKILL after --grace-period.
func TestAbortAllEndsABlockedCollective(t *testing.T) {
	cs := cpuRanks(t, 2)
	a := &attachment{w: &Worker{}, log: slog.New(slog.DiscardHandler)}
	c0 := a.track("job", cs[0])
	done := make(chan error, 1)
	go func() { // rank 1 never joins: this all-reduce waits for it
		x := []float32{1}
		done <- c0.AllReduce(context.Background(), Host(x), Host(x), Sum)
	}()
	select {
	case err := <-done:
		t.Fatalf("the all-reduce returned before the abort: %v", err)
	case <-time.After(100 * time.Millisecond):
	}
	a.abortAll()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("the all-reduce succeeded without rank 1")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the all-reduce still waits 10 s after abortAll")
	}
	if a.abortAll(); len(a.comms) != 0 {
		t.Errorf("%d communicators left after abortAll", len(a.comms))
	}
	x := []float32{1}
	if err := c0.AllReduce(context.Background(), Host(x), Host(x), Sum); err == nil || errors.Is(err, context.Canceled) {
		t.Errorf("an all-reduce on an aborted communicator: %v, want its error", err)
	}
}
