package worker

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	gotrainv1 "github.com/gotrain/gotrain/proto/gotrain/v1"
)

func TestAwaitNextTakesTheNextGeneration(t *testing.T) {
	w := &Worker{Rank: 2, WorldSize: 4, Generation: 3, logger: slog.New(slog.DiscardHandler)}
	got := make(chan *gotrainv1.GenerationStarted, 1)
	go func() {
		s, err := w.awaitNext(t.Context(), 3)
		if err != nil {
			t.Error(err)
		}
		got <- s
	}()
	// An old generation's start and this generation's end do not wake it up
	// for good; the next generation's start does.
	w.generationChanged(&gotrainv1.GenerationChange{Started: &gotrainv1.GenerationStarted{Generation: 3}})
	w.generationChanged(&gotrainv1.GenerationChange{Ended: &gotrainv1.GenerationEnded{Generation: 3}})
	next := &gotrainv1.GenerationStarted{Generation: 4, WorldSize: 4, RestartCount: 2,
		Ranks: []*gotrainv1.RankAssignment{{Rank: 2, LocalRank: 0, Survivor: true}, {Rank: 3, LocalRank: 1}}}
	w.generationChanged(&gotrainv1.GenerationChange{Started: next})
	select {
	case s := <-got:
		if s.GetGeneration() != 4 {
			t.Fatalf("got generation %d", s.GetGeneration())
		}
		env := map[string]string{}
		if err := w.adoptGeneration(s, func(k, v string) error { env[k] = v; return nil }, func(string) error { return nil }); err != nil {
			t.Fatal(err)
		}
		if w.Generation != 4 || w.RestartCount != 2 || w.LocalRank != 0 || w.LocalWorldSize != 2 || w.vars.Generation != 4 {
			t.Errorf("adopt: %+v", w)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("awaitNext did not return")
	}
}

func TestWatchEndCancelsWithCause(t *testing.T) {
	w := &Worker{Generation: 7}
	ctx, cancel := context.WithCancelCause(t.Context())
	defer cancel(nil)
	go w.watchEnd(ctx, 7, cancel)
	w.generationChanged(&gotrainv1.GenerationChange{Ended: &gotrainv1.GenerationEnded{Generation: 6}}) // older: ignored
	select {
	case <-ctx.Done():
		t.Fatal("canceled by the end of an older generation")
	case <-time.After(50 * time.Millisecond):
	}
	w.generationChanged(&gotrainv1.GenerationChange{Ended: &gotrainv1.GenerationEnded{Generation: 7}})
	<-ctx.Done()
	if !errors.Is(context.Cause(ctx), ErrGenerationEnded) {
		t.Errorf("cause %v", context.Cause(ctx))
	}
}

func TestAwaitNextGivesUpWhenCtxEnds(t *testing.T) {
	w := &Worker{Generation: 1}
	w.generationChanged(&gotrainv1.GenerationChange{Ended: &gotrainv1.GenerationEnded{Generation: 1}})
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, err := w.awaitNext(ctx, 1); !errors.Is(err, context.Canceled) {
		t.Errorf("err = %v", err)
	}
}

func TestRecoveryTimesFollowTheNewestChange(t *testing.T) {
	w := &Worker{Generation: 2}
	if e, s := w.recov.times(); !e.IsZero() || !s.IsZero() {
		t.Fatalf("times before any change: %v, %v", e, s)
	}
	before := time.Now()
	w.generationChanged(&gotrainv1.GenerationChange{Ended: &gotrainv1.GenerationEnded{Generation: 2}})
	ended, started := w.recov.times()
	if ended.Before(before) || !started.IsZero() {
		t.Fatalf("after ended: %v, %v", ended, started)
	}
	// An older generation's end does not move the time.
	w.generationChanged(&gotrainv1.GenerationChange{Ended: &gotrainv1.GenerationEnded{Generation: 1}})
	if e, _ := w.recov.times(); !e.Equal(ended) {
		t.Errorf("an older end moved the time: %v -> %v", ended, e)
	}
	w.generationChanged(&gotrainv1.GenerationChange{Started: &gotrainv1.GenerationStarted{Generation: 3}})
	if _, s := w.recov.times(); s.Before(ended) {
		t.Errorf("started %v before ended %v", s, ended)
	}
}
