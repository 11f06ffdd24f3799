package worker_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/gotrain/gotrain/worker"
	"github.com/gotrain/gotrain/worker/cpucomm"
	"github.com/gotrain/gotrain/worker/cpucomm/cpucommtest"
	"github.com/gotrain/gotrain/worker/nodereduce"
	"github.com/gotrain/gotrain/worker/pairreduce"
)

// A program names the copy-engine transports' refusal through worker
// alone: errors.As finds a CopyEngineUnavailableError with its rank and
// reason, and errors.Is matches ErrCopyEngineUnavailable, through wraps.
// Three ranks cannot pair, and one rank has nothing to reduce: both answer
// before any CUDA call, so this runs without a GPU.
func TestCopyEngineUnavailableNamedFromWorker(t *testing.T) {
	comms := cpucommtest.Ranks(t, cpucomm.Config{Name: "ce"}, 3)
	errs := cpucommtest.Each(comms, func(r int, c *cpucomm.Comm) error {
		_, err := pairreduce.Open(context.Background(), c, func(f func() error) error { return f() }, pairreduce.Config{Elements: 64, Buckets: 1})
		return fmt.Errorf("worker: DataParallel: %w", err)
	})
	for r, err := range errs {
		var un *worker.CopyEngineUnavailableError
		if !errors.As(err, &un) || un.Rank != r || un.Transport != "pairreduce" || un.Reason == "" {
			t.Errorf("rank %d: %v: errors.As found %+v", r, err, un)
		}
		if !errors.Is(err, worker.ErrCopyEngineUnavailable) {
			t.Errorf("rank %d: errors.Is(%v, ErrCopyEngineUnavailable) is false", r, err)
		}
	}
	one := cpucommtest.Ranks(t, cpucomm.Config{Name: "one"}, 1)[0]
	_, err := nodereduce.Open(t.Context(), one, func(f func() error) error { return f() }, nodereduce.Config{Grads: 1, Buckets: []nodereduce.Span{{Offset: 0, Len: 64}}})
	if !errors.Is(err, worker.ErrCopyEngineUnavailable) {
		t.Errorf("nodereduce with one rank: %v, want ErrCopyEngineUnavailable", err)
	}
	if errors.Is(errors.New("other"), worker.ErrCopyEngineUnavailable) {
		t.Error("an unrelated error matches ErrCopyEngineUnavailable")
	}
}
