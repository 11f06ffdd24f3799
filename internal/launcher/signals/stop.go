package signals

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Stopping by signal. gotrain waits in many places — for its coordinator,
// for the job token over munge, for the node's agent, for the other nodes,
// for a restart, for a coordinator that stopped answering — and SIGINT or
// SIGTERM must end every one of those waits at once. One place owns the
// signals (StopOnSignal): the first SIGINT or SIGTERM ends the run's
// context, its cause a *Stopped that names what gotrain was doing then (the
// phase each wait declares with SetPhase); every later signal goes on to
// the agent's loop, where a second SIGINT or SIGTERM kills the workers at
// once. Every wait selects on ctx.Done() and nothing else needs to know of
// signals.

// Stopped is why a run ended on SIGINT or SIGTERM: the cause of the
// context StopOnSignal returned. `gotrain launch` exits with ExitCode.
type Stopped struct {
	Sig syscall.Signal
	// Phase is what gotrain was doing when the signal came ("waiting for
	// the coordinator at 10.0.0.1:29400"); "" when it declared nothing.
	Phase string
	// For is how long it had been doing it.
	For time.Duration
	// Forced names the second signal that killed the workers at once; 0
	// when they stopped within their grace period.
	Forced syscall.Signal
}

func (s *Stopped) Error() string {
	msg := "gotrain: stopped by " + unix.SignalName(s.Sig)
	if s.Phase != "" {
		msg += fmt.Sprintf(" while %s (%s)", s.Phase, s.For.Round(time.Second))
	}
	if s.Forced != 0 {
		msg += fmt.Sprintf("; a second %s killed the workers at once", unix.SignalName(s.Forced))
	}
	return msg
}

// ExitCode is 128 + the signal: 130 for SIGINT, 143 for SIGTERM.
func (s *Stopped) ExitCode() int { return 128 + int(s.Sig) }

// stopState is what StopOnSignal keeps in its context.
type stopState struct {
	mu    sync.Mutex
	phase string
	since time.Time
}

type stopKey struct{}

// StopOnSignal returns a copy of ctx that the first SIGINT or SIGTERM read
// from in ends, with a *Stopped as its cause, and the channel every other
// signal, and every signal after that first one, goes on to (the agent's
// Config.Signals). stop releases the goroutine that reads in. A nil in
// never stops ctx.
func StopOnSignal(ctx context.Context, in <-chan os.Signal) (_ context.Context, out <-chan os.Signal, stop context.CancelFunc) {
	st := &stopState{since: time.Now()}
	ctx, cancel := context.WithCancelCause(context.WithValue(ctx, stopKey{}, st))
	fwd := make(chan os.Signal, 8)
	quit := make(chan struct{})
	go func() {
		first := true
		for {
			select {
			case <-quit:
				return
			case sig := <-in:
				s, _ := sig.(syscall.Signal)
				if first && (s == syscall.SIGINT || s == syscall.SIGTERM) {
					first = false
					st.mu.Lock()
					cancel(&Stopped{Sig: s, Phase: st.phase, For: time.Since(st.since)})
					st.mu.Unlock()
					continue
				}
				select {
				case fwd <- sig:
				default: // nobody reads: the run is ending anyway
				}
			}
		}
	}()
	var once sync.Once
	return ctx, fwd, func() {
		once.Do(func() { close(quit) })
		cancel(context.Canceled)
	}
}

// SetPhase records what the run of ctx (a context of StopOnSignal) is doing
// now, as the clause a signal's message ends with: "waiting for the
// coordinator at 10.0.0.1:29400". The clock restarts only when the phase
// changes; SetPhase reports whether it did (the caller may log it). With
// any other context it does nothing.
func SetPhase(ctx context.Context, phase string) (changed bool) {
	st, _ := ctx.Value(stopKey{}).(*stopState)
	if st == nil {
		return false
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.phase == phase {
		return false
	}
	st.phase, st.since = phase, time.Now()
	return true
}

// HasStop says whether ctx is of StopOnSignal.
func HasStop(ctx context.Context) bool { return ctx.Value(stopKey{}) != nil }

// StoppedBy returns the *Stopped that ended ctx, nil when a signal did not.
func StoppedBy(ctx context.Context) *Stopped {
	var st *Stopped
	if errors.As(context.Cause(ctx), &st) {
		return st
	}
	return nil
}

// StopCause returns err, or the *Stopped that ended ctx in its place when
// err is a failure the stop caused: a wait that ended with ctx. A success,
// and an exit status that is a signal's already, stay as they are.
func StopCause(ctx context.Context, err error) error {
	st := StoppedBy(ctx)
	if err == nil || st == nil {
		return err
	}
	var ec interface{ ExitCode() int }
	if errors.As(err, &ec) && ec.ExitCode() > 128 {
		return err
	}
	return st
}
