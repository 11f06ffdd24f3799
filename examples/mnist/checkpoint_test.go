package main

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/gotrain/gotrain/worker/comm"
)

// crashAfter fails every all-reduce after the first n, like a rank whose
// peer died.
type crashAfter struct {
	soloComm
	n *int
}

var errCrash = errors.New("peer died")

func (c crashAfter) AllReduce(ctx context.Context, send, recv comm.Buffer, op comm.Op) error {
	if *c.n == 0 {
		return errCrash
	}
	*c.n--
	return c.soloComm.AllReduce(ctx, send, recv, op)
}

// TestResumeIsExact: a run that crashes mid-epoch (twice) and resumes from
// its checkpoints ends with the same weights as a run that never crashed.
func TestResumeIsExact(t *testing.T) {
	ds := testData(t)
	cfg := defaultConfig()
	cfg.Limit, cfg.Epochs, cfg.BatchSize = 1200, 3, 40 // 30 steps an epoch
	want, err := train(t.Context(), soloComm{}, ds, cfg, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}

	cfg.CheckpointDir, cfg.CheckpointEvery = t.TempDir(), 7
	// 30 steps + 1 stats all-reduce an epoch: crash in epoch 2, then in epoch 3.
	for _, n := range []int{45, 40} {
		_, err := train(t.Context(), crashAfter{n: &n}, ds, cfg, &bytes.Buffer{})
		if !errors.Is(err, errCrash) {
			t.Fatalf("crash run: %v", err)
		}
	}
	var out bytes.Buffer
	got, err := train(t.Context(), soloComm{}, ds, cfg, &out)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(out.String(), "found the state of step 77 in the checkpoint\nresumed at epoch 3 step ") {
		t.Errorf("output does not start with where the state was found and the resume:\n%s", out.String())
	}
	if got.WeightHash != want.WeightHash || got.TestAccuracy != want.TestAccuracy {
		t.Errorf("resumed run: hash %#x accuracy %v; uninterrupted: %#x %v", got.WeightHash, got.TestAccuracy, want.WeightHash, want.TestAccuracy)
	}

	// A finished run resumes at its end and reports the same result.
	again, err := train(t.Context(), soloComm{}, ds, cfg, &bytes.Buffer{})
	if err != nil || again.WeightHash != want.WeightHash || again.TestAccuracy != want.TestAccuracy || again.Epochs != cfg.Epochs {
		t.Errorf("rerun of a finished run: %+v, %v", again, err)
	}
}
