package worker

import (
	"context"
	"encoding/binary"
	"errors"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gotrain/gotrain/internal/memsnap"
	"github.com/gotrain/gotrain/worker/checkpoint"
	"github.com/gotrain/gotrain/worker/cpucomm"
	"github.com/gotrain/gotrain/worker/cpucomm/cpucommtest"
)

// stateOf is a rank's test state: a step stamp and a marker in two buffers
// (int64 and float32), as a program's header and weights.
func stateOf(step int64, mark float32) ([]int64, []float32) {
	return []int64{step, 0}, []float32{mark, mark + 1, mark + 2}
}

// encode is the bytes Save would be given for stateOf's buffers.
func encode(h []int64, w []float32) []byte {
	var b []byte
	for _, x := range h {
		b = binary.LittleEndian.AppendUint64(b, uint64(x))
	}
	return append(b, Host(w).HostBytes()...)
}

// diskAt is a checkpoint directory holding stateOf(step, mark).
func diskAt(t *testing.T, step int64, mark float32) checkpoint.Dir {
	t.Helper()
	d := checkpoint.Dir{Path: t.TempDir()}
	if err := d.Save(step, encode(stateOf(step, mark))); err != nil {
		t.Fatal(err)
	}
	return d
}

// agentWith serves a memsnap store holding rank's snapshot of
// stateOf(step, mark), as the rank's agent does, and returns the rank's
// handle on it.
func agentWith(t *testing.T, rank int, step int64, mark float32) *Snapshots {
	t.Helper()
	store := memsnap.NewStore(0)
	t.Cleanup(func() { store.Close() })
	sock := filepath.Join(t.TempDir(), memsnap.SocketName)
	lis, err := memsnap.Listen(sock)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go func() { _ = (&memsnap.Server{Store: store, Token: "tok"}).Serve(ctx, lis) }()
	dial := func() *Snapshots {
		c, err := memsnap.Dial(t.Context(), sock, "tok", rank)
		if err != nil {
			t.Fatal(err)
		}
		return &Snapshots{rank: rank, log: slog.New(slog.DiscardHandler), c: c, held: -1}
	}
	w := dial()
	h, p := stateOf(step, mark)
	if !w.Save(step, Host(h), Host(p)) {
		t.Fatal("Save skipped the first snapshot")
	}
	if err := w.Wait(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	s := dial() // a restarted process
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// restoreAll runs Restore on every rank with its tiers, each rank's
// buffers starting as stateOf(-1, 100+rank): what a fresh start draws.
func restoreAll(t *testing.T, tiers []Tiers) ([]Restored, []error, [][]float32) {
	t.Helper()
	comms := cpucommtest.Ranks(t, cpucomm.Config{Name: "restore", Generation: 1}, len(tiers))
	res := make([]Restored, len(tiers))
	got := make([][]float32, len(tiers))
	errs := cpucommtest.Each(comms, func(r int, c *cpucomm.Comm) error {
		h, w := stateOf(-1, float32(100+r))
		if tiers[r].Held {
			h, w = stateOf(tiers[r].HeldStep, float32(10*r))
		}
		var err error
		res[r], err = Restore(t.Context(), c, tiers[r], Host(h), Host(w))
		got[r] = w
		if err == nil && h[0] != res[r].Step {
			t.Errorf("rank %d: the header says step %d, Restore %d", r, h[0], res[r].Step)
		}
		return err
	})
	return res, errs, got
}

func TestRestoreAgreesOnTheNewestState(t *testing.T) {
	for _, tc := range []struct {
		name       string
		tiers      func(t *testing.T) []Tiers
		step       int64
		source     string
		rank       int
		mark       float32
		localSteps []int64
	}{{
		name: "the newest disk checkpoint of any rank",
		tiers: func(t *testing.T) []Tiers {
			return []Tiers{{}, {Disk: diskAt(t, 7, 1)}, {Disk: diskAt(t, 5, 2)}}
		},
		step: 7, source: FromDisk, rank: 1, mark: 1, localSteps: []int64{-1, 7, 5},
	}, {
		name: "a tie goes to the lowest rank",
		tiers: func(t *testing.T) []Tiers {
			return []Tiers{{Disk: diskAt(t, 3, 0)}, {Disk: diskAt(t, 7, 1)}, {Disk: diskAt(t, 7, 2)}}
		},
		step: 7, source: FromDisk, rank: 1, mark: 1, localSteps: []int64{3, 7, 7},
	}, {
		name: "the agent's memory before an older disk",
		tiers: func(t *testing.T) []Tiers {
			return []Tiers{{Disk: diskAt(t, 7, 0)}, {Disk: diskAt(t, 7, 1)}, {Snapshots: agentWith(t, 2, 9, 2), Disk: diskAt(t, 7, 2)}}
		},
		step: 9, source: FromAgent, rank: 2, mark: 2, localSteps: []int64{7, 7, 9},
	}, {
		name: "a survivor's live state",
		tiers: func(t *testing.T) []Tiers {
			return []Tiers{{Snapshots: agentWith(t, 0, 8, 0)}, {Held: true, HeldStep: 12}, {Held: true, HeldStep: 12}}
		},
		step: 12, source: FromSurvivor, rank: 1, mark: 10, localSteps: []int64{8, 12, 12},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			res, errs, got := restoreAll(t, tc.tiers(t))
			for r, err := range errs {
				if err != nil {
					t.Fatalf("rank %d: %v", r, err)
				}
				if res[r].Step != tc.step || res[r].Source != tc.source || res[r].Rank != tc.rank || res[r].LocalStep != tc.localSteps[r] {
					t.Errorf("rank %d: restored %+v; want step %d from %s of rank %d, found %d itself", r, res[r], tc.step, tc.source, tc.rank, tc.localSteps[r])
				}
				if got[r][0] != tc.mark || got[r][2] != tc.mark+2 {
					t.Errorf("rank %d holds %v, want rank %d's state marked %v", r, got[r], tc.rank, tc.mark)
				}
			}
		})
	}
}

// With nothing anywhere every rank hears ErrNoState and starts from rank
// 0's buffers.
func TestRestoreFreshStartIsRankZeros(t *testing.T) {
	res, errs, got := restoreAll(t, []Tiers{{Disk: checkpoint.Dir{Path: t.TempDir()}}, {}, {}})
	for r, err := range errs {
		if !errors.Is(err, ErrNoState) {
			t.Fatalf("rank %d: %v, want ErrNoState", r, err)
		}
		if res[r].Rank != -1 || res[r].Source != "" || got[r][0] != 100 {
			t.Errorf("rank %d: %+v holding %v; want no source and rank 0's fresh state (100…)", r, res[r], got[r])
		}
	}
}

// A rank whose state does not fit the buffers fails Restore on every rank
// instead of leaving them in a broadcast; each error names that rank.
func TestRestoreFailsEverywhereWhenOneRankCannotRead(t *testing.T) {
	bad := checkpoint.Dir{Path: t.TempDir()}
	if err := bad.Save(9, []byte("a state of another model")); err != nil {
		t.Fatal(err)
	}
	_, errs, _ := restoreAll(t, []Tiers{{Disk: diskAt(t, 7, 0)}, {Disk: bad}, {}})
	for r, err := range errs {
		if err == nil || !strings.Contains(err.Error(), "rank 1") {
			t.Errorf("rank %d: %v; want an error naming rank 1", r, err)
		}
	}
	if errs[1] == nil || !strings.Contains(errs[1].Error(), "holds 24 bytes, the buffers 28") {
		t.Errorf("rank 1's own error %v does not say why", errs[1])
	}
}
