package signals

import (
	"context"
	"errors"
	"os"
	"syscall"
	"testing"
	"time"
)

// The first SIGINT or SIGTERM ends the context, its cause naming the phase;
// every other signal, and the next SIGTERM, go on to the loop.
func TestStopOnSignal(t *testing.T) {
	in := make(chan os.Signal, 4)
	ctx, out, stop := StopOnSignal(t.Context(), in)
	defer stop()
	SetPhase(ctx, "waiting for the coordinator at 10.0.0.1:29400")
	if SetPhase(ctx, "waiting for the coordinator at 10.0.0.1:29400") {
		t.Error("SetPhase of the same phase says it changed")
	}
	in <- syscall.SIGUSR1
	if got := <-out; got != syscall.SIGUSR1 {
		t.Fatalf("forwarded %v, want SIGUSR1", got)
	}
	if ctx.Err() != nil {
		t.Fatal("SIGUSR1 ended the context")
	}
	in <- syscall.SIGTERM
	<-ctx.Done()
	st := StoppedBy(ctx)
	if st == nil || st.Sig != syscall.SIGTERM || st.Phase != "waiting for the coordinator at 10.0.0.1:29400" || st.ExitCode() != 143 {
		t.Fatalf("cause %v (%#v); want SIGTERM while waiting for the coordinator", context.Cause(ctx), st)
	}
	if want := "gotrain: stopped by SIGTERM while waiting for the coordinator at 10.0.0.1:29400 (0s)"; st.Error() != want {
		t.Errorf("message %q, want %q", st.Error(), want)
	}
	in <- syscall.SIGINT
	select {
	case got := <-out:
		if got != syscall.SIGINT {
			t.Fatalf("forwarded %v, want SIGINT", got)
		}
	case <-time.After(time.Minute):
		t.Fatal("the second signal was not passed on (it must kill the workers at once)")
	}

	// StopCause: a failure the stop caused reads as the stop.
	for _, tc := range []struct {
		err, want error
	}{
		{nil, nil},
		{errors.New("join the coordinator at x: context canceled"), st},
		{exitStatus(143), nil},
	} {
		got := StopCause(ctx, tc.err)
		if tc.want == nil && got != tc.err || tc.want != nil && got != tc.want {
			t.Errorf("StopCause(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
	if err := StopCause(t.Context(), errors.New("x")); StoppedBy(t.Context()) != nil || err.Error() != "x" {
		t.Errorf("StopCause without a stop changed the error: %v", err)
	}
}

// exitStatus is an error with an exit status, as launcher.ExitError is.
type exitStatus int

func (e exitStatus) Error() string { return "stopped already" }
func (e exitStatus) ExitCode() int { return int(e) }
