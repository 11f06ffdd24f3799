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
		{"", 0, true, ""}, // weight gradients first by default
		{"--weight-grad-first=false", 0, false, ""},
		{"--comm-priority high", 1, true, ""},
		{"--comm-priority normal --nccl-max-ctas 16", 1, true, ""},
		{"--comm-priority high --nccl-min-ctas 4 --nccl-max-ctas 16 --weight-grad-first", 2, true, ""},
		{"--comm-priority urgent", 0, false, "want normal or high"},
		{"--nccl-max-ctas -1", 0, false, "min ≤ max"},
		{"--nccl-min-ctas 16 --nccl-max-ctas 8", 0, false, "min ≤ max"},
		{"--nccl-cta-policy efficiency", 1, true, ""},
		{"--nccl-cta-policy default", 0, true, ""},
		{"--nccl-cta-policy fast", 0, false, "want default, efficiency or zero"},
		{"--chunk-first-mb 4", 0, true, ""},
		{"--chunk-first-mb -1", 0, false, "must not be negative"},
		{"--transport copy-engine", 0, true, ""},
		{"--transport nccl --nccl-max-ctas 8", 1, true, ""},
		{"--transport ce", 0, false, "want auto, nccl or copy-engine"},
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

func TestDiagnosticFlags(t *testing.T) {
	for _, tc := range []struct {
		args string
		err  string // "" for none
	}{
		{"--trace 5 --no-reduce --blas-sm-target 100", ""},
		{"--device gpu --trace 100", ""},
		{"--mode mnist --blas-sm-target 64", ""},
		{"--trace -1", "want 0 (off) or more"},
		{"--blas-sm-target -8", "want 0 (off) or more"},
		{"--steps 10 --trace 11", "at most --steps"},
		{"--mode mnist --trace 2", "--mode synthetic"},
		{"--mode mnist --no-reduce", "--mode synthetic"},
		{"--no-reduce --accum 2", "--accum"},
		{"--device cpu --trace 2", "--trace is for the GPU path"},
		{"--device cpu --no-reduce", "--no-reduce is for the GPU path"},
		{"--device cpu --blas-sm-target 8", "--blas-sm-target is for the GPU path"},
	} {
		_, err := parseFlags(strings.Fields(tc.args), io.Discard)
		switch {
		case tc.err == "" && err != nil:
			t.Errorf("%q: %v", tc.args, err)
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("%q: %v, want an error with %q", tc.args, err, tc.err)
		}
	}
	var help strings.Builder
	parseFlags([]string{"--help"}, &help)
	for _, f := range []string{"-trace", "-no-reduce", "-blas-sm-target"} {
		if !strings.Contains(help.String(), f) {
			t.Errorf("--help does not describe %s", f)
		}
	}
}
