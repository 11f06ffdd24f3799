package worker_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/gotrain/gotrain/worker"
	"github.com/gotrain/gotrain/worker/comm/commtest"
	"github.com/gotrain/gotrain/worker/cpucomm"
	"github.com/gotrain/gotrain/worker/nodereduce"
	"github.com/gotrain/gotrain/worker/pairreduce"
)

// A program names the copy-engine transports' refusal through worker
// alone: errors.As finds a CopyEngineUnavailableError with its rank and
// reason, and errors.Is matches ErrCopyEngineUnavailable, through wraps.
// Three ranks cannot pair, and one rank has nothing to reduce: both answer
// before any CUDA call, so this runs without a GPU.
func TestCopyEngineUnavailableNamedFromWorker(t *testing.T) {
	const size = 3
	store := commtest.NewMemStore()
	errs := make([]error, size)
	var wg sync.WaitGroup
	for r := range size {
		wg.Go(func() {
			c, err := cpucomm.New(t.Context(), cpucomm.Config{Name: "ce", Rank: r, Size: size, Host: "127.0.0.1", Store: store})
			if err != nil {
				errs[r] = err
				return
			}
			defer c.Close()
			_, err = pairreduce.Open(context.Background(), c, func(f func() error) error { return f() }, pairreduce.Config{Elements: 64, Buckets: 1})
			errs[r] = fmt.Errorf("worker: DataParallel: %w", err)
		})
	}
	wg.Wait()
	for r, err := range errs {
		var un *worker.CopyEngineUnavailableError
		if !errors.As(err, &un) || un.Rank != r || un.Transport != "pairreduce" || un.Reason == "" {
			t.Errorf("rank %d: %v: errors.As found %+v", r, err, un)
		}
		if !errors.Is(err, worker.ErrCopyEngineUnavailable) {
			t.Errorf("rank %d: errors.Is(%v, ErrCopyEngineUnavailable) is false", r, err)
		}
	}
	one, err := cpucomm.New(t.Context(), cpucomm.Config{Name: "one", Rank: 0, Size: 1, Host: "127.0.0.1", Store: commtest.NewMemStore()})
	if err != nil {
		t.Fatal(err)
	}
	defer one.Close()
	_, err = nodereduce.Open(t.Context(), one, func(f func() error) error { return f() }, nodereduce.Config{Grads: 1, Buckets: []nodereduce.Span{{Offset: 0, Len: 64}}})
	if !errors.Is(err, worker.ErrCopyEngineUnavailable) {
		t.Errorf("nodereduce with one rank: %v, want ErrCopyEngineUnavailable", err)
	}
	if errors.Is(errors.New("other"), worker.ErrCopyEngineUnavailable) {
		t.Error("an unrelated error matches ErrCopyEngineUnavailable")
	}
}
