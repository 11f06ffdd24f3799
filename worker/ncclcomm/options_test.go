package ncclcomm

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/gotrain/gotrain/gpu/cudadrv"
	"github.com/gotrain/gotrain/worker/comm"
	"github.com/gotrain/gotrain/worker/comm/commtest"
)

func TestTuningValidate(t *testing.T) {
	for _, tc := range []struct {
		tun  Tuning
		want string // "" for valid
	}{
		{Tuning{}, ""},
		{Tuning{HighPriorityStream: true, MinCTAs: 2, MaxCTAs: 16}, ""},
		{Tuning{MaxCTAs: 8}, ""},
		{Tuning{MinCTAs: 4, MaxCTAs: 4}, ""},
		{Tuning{MinCTAs: -1}, "want 0"},
		{Tuning{MaxCTAs: -3}, "want 0"},
		{Tuning{MinCTAs: 16, MaxCTAs: 8}, "want min ≤ max"},
		{Tuning{CTAPolicy: CTAPolicyEfficiency}, ""},
		{Tuning{CTAPolicy: 7}, "want default, efficiency or zero"},
	} {
		err := (&Config{Name: "x", Size: 1, Tuning: tc.tun}).validate()
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%+v: %v, want valid", tc.tun, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%+v: %v, want an error with %q", tc.tun, err, tc.want)
		}
	}
}

func TestTuningNCCLConfig(t *testing.T) {
	cfg := Tuning{}.ncclConfig("mlp/0")
	if cfg.CommName != "mlp/0" {
		t.Errorf("CommName %q", cfg.CommName)
	}
	if _, ok := cfg.MinCTAs.Value(); ok {
		t.Error("zero Tuning sets MinCTAs")
	}
	if _, ok := cfg.MaxCTAs.Value(); ok {
		t.Error("zero Tuning sets MaxCTAs")
	}
	cfg = Tuning{MinCTAs: 2, MaxCTAs: 16}.ncclConfig("x")
	if v, ok := cfg.MinCTAs.Value(); !ok || v != 2 {
		t.Errorf("MinCTAs = %d, %t; want 2", v, ok)
	}
	if v, ok := cfg.MaxCTAs.Value(); !ok || v != 16 {
		t.Errorf("MaxCTAs = %d, %t; want 16", v, ok)
	}
	if cfg.NonBlocking {
		t.Error("the collectives' communicator must be blocking")
	}
	if _, ok := cfg.CTAPolicy.Value(); ok {
		t.Error("CTAPolicy set without a policy: want it left to NCCL")
	}
	cfg = Tuning{CTAPolicy: CTAPolicyEfficiency}.ncclConfig("x")
	if v, ok := cfg.CTAPolicy.Value(); !ok || v != 1 {
		t.Errorf("CTAPolicy = %d, %t; want NCCL_CTA_POLICY_EFFICIENCY (1)", v, ok)
	}
}

func TestParseCTAPolicy(t *testing.T) {
	for in, want := range map[string]CTAPolicy{"": CTAPolicyDefault, "default": CTAPolicyDefault, "efficiency": CTAPolicyEfficiency, "zero": CTAPolicyZero} {
		if got, err := ParseCTAPolicy(in); err != nil || got != want {
			t.Errorf("ParseCTAPolicy(%q) = %v, %v; want %v", in, got, err, want)
		}
		if in != "" && want.String() != in {
			t.Errorf("%v.String() = %q, want %q", want, want.String(), in)
		}
	}
	if _, err := ParseCTAPolicy("fast"); err == nil || !strings.Contains(err.Error(), "want default, efficiency or zero") {
		t.Errorf("ParseCTAPolicy(fast): %v", err)
	}
}

func TestTuningStreamPriority(t *testing.T) {
	for _, tc := range []struct {
		high            bool
		least, greatest int
		want            int
		custom          bool
	}{
		{false, 0, -5, 0, false},
		{true, 0, -5, -5, true}, // H100/H200: 0 (default) .. -5 (most urgent)
		{true, 0, 0, 0, false},  // a device without priorities
	} {
		p, custom := Tuning{HighPriorityStream: tc.high}.streamPriority(tc.least, tc.greatest)
		if p != tc.want || custom != tc.custom {
			t.Errorf("high=%t range %d..%d: %d, %t; want %d, %t", tc.high, tc.least, tc.greatest, p, custom, tc.want, tc.custom)
		}
	}
}

// TestGPUTuning creates communicators with a high-priority stream and CTA
// limits and runs an all-reduce on them.
func TestGPUTuning(t *testing.T) {
	n := gpus(t, 1)
	store := commtest.NewMemStore()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	tun := Tuning{HighPriorityStream: true, MinCTAs: 1, MaxCTAs: 4}
	comms := make([]*Comm, n)
	err := onAll(n, func(r int) (err error) {
		comms[r], err = New(ctx, Config{Name: "tuned", Rank: r, Size: n, Device: r, Store: store, Tuning: tun})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	defer onAll(n, func(r int) error { return comms[r].Close() })
	err = onAll(n, func(r int) error {
		c := comms[r]
		if c.Tuning() != tun {
			t.Errorf("rank %d: Tuning() = %+v", r, c.Tuning())
		}
		_, greatest, err := cudadrvPriorityRange(c)
		if err != nil {
			return err
		}
		t.Logf("rank %d: stream priority range greatest %d", r, greatest)
		x := fill[float32](r, 1<<16)
		if err := c.AllReduce(ctx, comm.Host(x), comm.Host(x), comm.Sum); err != nil {
			return err
		}
		return checkSlice(x, func(i int) float64 {
			s := 0.0
			for q := range n {
				s += val(q, i)
			}
			return s
		})
	})
	if err != nil {
		t.Fatal(err)
	}
}

func cudadrvPriorityRange(c *Comm) (least, greatest int, err error) {
	err = c.Do(func() (err error) {
		least, greatest, err = cudadrv.StreamPriorityRange()
		return err
	})
	return least, greatest, err
}
