package main

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func TestQuantile(t *testing.T) {
	var ds []time.Duration
	for i := 1; i <= 200; i++ {
		ds = append(ds, time.Duration(i)*time.Millisecond)
	}
	if got := quantile(ds, 0.5); got != 100*time.Millisecond {
		t.Errorf("p50 of 1..200 ms = %v, want 100ms", got)
	}
	if got := quantile(ds, 0.99); got != 198*time.Millisecond {
		t.Errorf("p99 of 1..200 ms = %v, want 198ms", got)
	}
	if got := quantile(ds[:1], 0.99); got != time.Millisecond {
		t.Errorf("p99 of one sample = %v", got)
	}
}

func TestOptionsCheck(t *testing.T) {
	ok := options{mode: "shrink", how: "revoke", launch: "group", ranks: 4, cycles: 1, count: 1}
	if err := ok.check(); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		edit func(*options)
		want string
	}{
		{func(o *options) { o.mode = "split" }, "-mode"},
		{func(o *options) { o.how = "destroy" }, "-how"},
		{func(o *options) { o.ranks = 2 }, "at least 3"},
		{func(o *options) { o.growRoot = 3 }, "-grow-root"},
		{func(o *options) { o.launch = "async" }, "-launch"},
	} {
		o := ok
		tc.edit(&o)
		if err := o.check(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("check() = %v, want it to name %s", err, tc.want)
		}
	}
}

// A background call that outlives the timeout is reported as a hang, and
// one that fails is an error.
func TestBackgroundHang(t *testing.T) {
	bg := &background{timeout: 20 * time.Millisecond, stats: newStats()}
	release := make(chan struct{})
	bg.start("stuck-abort", 7, func() error { <-release; return nil })
	var hang *hangError
	for !errors.As(bg.check(7), &hang) {
		time.Sleep(5 * time.Millisecond) // until the timeout has passed; the test's -timeout bounds it
	}
	if !strings.Contains(hang.Error(), "stuck-abort of cycle 7") {
		t.Errorf("hang = %q", hang)
	}
	close(release)
	bg.start("failing-abort", 8, func() error { return errors.New("boom") })
	if err := bg.barrier(8, "bg-wait"); err == nil || !strings.Contains(err.Error(), "failing-abort: boom") {
		t.Errorf("barrier after a failing call: %v", err)
	}
}
