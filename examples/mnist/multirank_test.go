package main

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/gotrain/gotrain/examples/internal/mnistdata"

	"github.com/gotrain/gotrain/worker/comm"
	"github.com/gotrain/gotrain/worker/comm/commtest"
	"github.com/gotrain/gotrain/worker/cpucomm"
)

// trainRanks trains with size ranks as goroutines, connected by the CPU
// backend over loopback, and returns each rank's result and output.
func trainRanks(t *testing.T, size int, ds *mnistdata.Dataset, cfg config) ([]result, []string) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	store := commtest.NewMemStore()
	results := make([]result, size)
	outs := make([]bytes.Buffer, size)
	errs := make([]error, size)
	var wg sync.WaitGroup
	for rank := range size {
		wg.Go(func() {
			c, err := cpucomm.New(ctx, cpucomm.Config{
				Name: "mnist-test", Rank: rank, Size: size,
				Host: "127.0.0.1", Store: store,
			})
			if err != nil {
				errs[rank] = err
				cancel()
				return
			}
			defer c.Close()
			results[rank], errs[rank] = train(ctx, c, ds, cfg, &outs[rank])
			if errs[rank] != nil {
				cancel() // so that the other ranks stop waiting for this one
			}
		})
	}
	wg.Wait()
	for rank, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", rank, err)
		}
	}
	lines := make([]string, size)
	for i := range outs {
		lines[i] = outs[i].String()
	}
	return results, lines
}

func TestTrainRanksAgree(t *testing.T) {
	ds := testData(t)
	cfg := defaultConfig()
	cfg.Limit = 3000
	cfg.Epochs = 2
	cfg.BatchSize = 16
	for _, size := range []int{2, 3} {
		t.Run(fmt.Sprintf("ranks=%d", size), func(t *testing.T) {
			results, outs := trainRanks(t, size, ds, cfg)
			t.Logf("rank 0:\n%s", outs[0])
			for rank, r := range results {
				if r.WeightHash != results[0].WeightHash {
					t.Errorf("rank %d ends with weight hash %#x, rank 0 with %#x", rank, r.WeightHash, results[0].WeightHash)
				}
				if !r.RanksAgree {
					t.Errorf("rank %d: ranks_agree is false", rank)
				}
				if r.TestAccuracy != results[0].TestAccuracy || r.Loss != results[0].Loss {
					t.Errorf("rank %d: accuracy %v loss %v, rank 0: accuracy %v loss %v",
						rank, r.TestAccuracy, r.Loss, results[0].TestAccuracy, results[0].Loss)
				}
				if rank > 0 && outs[rank] != "" {
					t.Errorf("rank %d wrote %q; only rank 0 writes", rank, outs[rank])
				}
			}
			if results[0].TestAccuracy < 0.8 {
				t.Errorf("test accuracy %.4f, want at least 0.8", results[0].TestAccuracy)
			}
			lines := strings.Split(strings.TrimSpace(outs[0]), "\n")
			if want := "final test_accuracy=" + formatAccuracy(results[0].TestAccuracy) + " ranks_agree=true"; lines[len(lines)-1] != want {
				t.Errorf("last line %q, want %q", lines[len(lines)-1], want)
			}

			// The run is deterministic: the same seed gives the same weights.
			again, _ := trainRanks(t, size, ds, cfg)
			if again[0].WeightHash != results[0].WeightHash {
				t.Errorf("two runs with seed %d end with weight hashes %#x and %#x", cfg.Seed, results[0].WeightHash, again[0].WeightHash)
			}
		})
	}
}

// splitBrain is a communicator of one rank that claims a peer whose weights
// differ: its all-gather reports a second, different hash.
type splitBrain struct{ soloComm }

func (splitBrain) AllGather(ctx context.Context, send, recv comm.Buffer) error {
	got := recv.Int64s()
	got[0] = send.Int64s()[0]
	got[1] = got[0] + 1
	return nil
}

func (splitBrain) Size() int { return 2 }

func TestCompareWeightsDisagree(t *testing.T) {
	params := []float32{1, 2, 3}
	agree, _, err := compareWeights(t.Context(), splitBrain{}, params)
	if err != nil {
		t.Fatal(err)
	}
	if agree {
		t.Error("ranks with different hashes agree")
	}
	agree, _, err = compareWeights(t.Context(), soloComm{}, params)
	if err != nil || !agree {
		t.Errorf("one rank: agree = %v, err = %v; want true, nil", agree, err)
	}
}
