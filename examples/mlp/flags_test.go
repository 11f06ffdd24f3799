package main

import (
	"io"
	"strings"
	"testing"
)

func TestTuningFlags(t *testing.T) {
	for _, tc := range []struct {
		args    string
		opts    int    // communicator options
		wgFirst bool   // --weight-grad-first
		err     string // "" for none
	}{
		{"", 0, false, ""},
		{"--comm-priority high", 1, false, ""},
		{"--comm-priority normal --nccl-max-ctas 16", 1, false, ""},
		{"--comm-priority high --nccl-min-ctas 4 --nccl-max-ctas 16 --weight-grad-first", 2, true, ""},
		{"--comm-priority urgent", 0, false, "want normal or high"},
		{"--nccl-max-ctas -1", 0, false, "min ≤ max"},
		{"--nccl-min-ctas 16 --nccl-max-ctas 8", 0, false, "min ≤ max"},
	} {
		o, err := parseFlags(strings.Fields(tc.args), io.Discard)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%q: %v, want an error with %q", tc.args, err, tc.err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%q: %v", tc.args, err)
			continue
		}
		if got := len(o.commOptions()); got != tc.opts || o.wgFirst != tc.wgFirst {
			t.Errorf("%q: %d communicator options, weight-grad-first %t; want %d, %t", tc.args, got, o.wgFirst, tc.opts, tc.wgFirst)
		}
	}
}
