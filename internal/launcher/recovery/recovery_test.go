package recovery

import (
	"slices"
	"testing"
	"time"
)

// at is t0 plus ms milliseconds.
var t0 = time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)

func at(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }

func TestDecide(t *testing.T) {
	launcher := Facts{Generation: 2, Failed: at(0), Ended: at(10), Stopped: at(210), Started: at(212), Program: true}
	with := func(ranks ...Rank) Facts { f := launcher; f.Ranks = ranks; return f }
	for _, tc := range []struct {
		name  string
		facts Facts
		want  string
		miss  []string
		rank  int
	}{
		{
			name: "standby, restore after init",
			facts: with(Rank{Rank: 0, Started: at(262), Standby: true, Events: []Event{
				{Name: "collective", End: at(100)}, // the old process's: before init
				{Name: "init_process_group", Start: at(562), End: at(962)},
				{Name: "collective", End: at(1000)}, // inside the restore: before it ended
				{Name: "restore", End: at(1112), Seconds: 0.15, Bytes: 1_610_000_000, Source: "agent", Step: 40},
				{Name: "collective", End: at(1802)},
				{Name: "collective", End: at(1900)},
			}}),
			want: "gotrain: recovered in 1.80 s: detected 0.01 · stopped 0.20 · started 0.05 (standby) · imports 0.30 · init_process_group 0.40 · restored 1.6 GB from agent memory 0.15 · first step 0.69",
		},
		{
			name: "cold, no restore, a rendezvous wait (backoff)",
			facts: func() Facts {
				f := with(Rank{Rank: 3, Started: at(1300), Events: []Event{
					{Name: "init_process_group", Start: at(2300), End: at(2500)},
					{Name: "collective", End: at(2600)},
				}})
				f.Started = at(1250)
				return f
			}(),
			want: "gotrain: recovered in 2.60 s: detected 0.01 · stopped 0.20 · rendezvous 1.04 · started 0.05 (cold) · imports 1.00 · init_process_group 0.20 · first step 0.10",
			rank: 3,
		},
		{
			name: "a restore before init_process_group (from agent memory, no group needed)",
			facts: with(Rank{Rank: 0, Started: at(262), Standby: true, Events: []Event{
				{Name: "restore", End: at(500), Seconds: 0.1, Bytes: 50_000_000, Source: "peer"},
				{Name: "init_process_group", Start: at(700), End: at(800)},
				{Name: "collective", End: at(900)},
			}}),
			want: "gotrain: recovered in 0.90 s: detected 0.01 · stopped 0.20 · started 0.05 (standby) · imports 0.14 · restored 50 MB from a peer's agent 0.10 · setup 0.20 · init_process_group 0.10 · first step 0.10",
		},
		{
			name: "the node's slowest rank tells",
			facts: with(
				Rank{Rank: 0, Started: at(262), Standby: true, Events: []Event{{Name: "init_process_group", Start: at(300), End: at(400)}, {Name: "collective", End: at(500)}}},
				Rank{Rank: 1, Started: at(270), Events: []Event{{Name: "init_process_group", Start: at(300), End: at(400)}, {Name: "collective", End: at(700)}}},
			),
			want: "gotrain: recovered in 0.70 s: detected 0.01 · stopped 0.20 · started 0.06 (cold) · imports 0.03 · init_process_group 0.10 · first step 0.30",
			rank: 1,
		},
		{
			name: "no first step yet",
			facts: with(
				Rank{Rank: 0, Started: at(262), Events: []Event{{Name: "init_process_group", Start: at(300), End: at(400)}, {Name: "collective", End: at(500)}}},
				Rank{Rank: 1, Started: at(262), Events: []Event{{Name: "init_process_group", Start: at(300), End: at(400)}}},
			),
			want: "gotrain: recovery of generation 2 so far (rank 1 has no first step recorded yet) 0.40 s: detected 0.01 · stopped 0.20 · started 0.05 (cold) · imports 0.04 · init_process_group 0.10",
			miss: []string{FirstStep},
			rank: 1,
		},
		{
			name: "a program without the hook: the launcher's phases",
			facts: func() Facts {
				f := with(Rank{Rank: 0, Started: at(262), Standby: true})
				f.Program = false
				return f
			}(),
			want: "gotrain: recovered in 0.26 s: detected 0.01 · stopped 0.20 · started 0.05 (standby)",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := Decide(tc.facts)
			if line := got.Line(); line != tc.want {
				t.Errorf("line\n got %s\nwant %s", line, tc.want)
			}
			if !slices.Equal(got.Missing, tc.miss) || got.Rank != tc.rank {
				t.Errorf("missing %v rank %d, want %v rank %d", got.Missing, got.Rank, tc.miss, tc.rank)
			}
			var sum float64
			for _, p := range got.Phases {
				sum += p.Seconds
			}
			if d := sum - got.Total; d > 0.006 || d < -0.006 {
				t.Errorf("phases add up to %.3f s, total %.3f s", sum, got.Total)
			}
		})
	}
}
