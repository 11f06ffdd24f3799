package main

import (
	"bytes"
	"errors"
	"flag"
	"strings"
	"testing"
)

func TestParseFlags(t *testing.T) {
	cfg, err := parseFlags([]string{"--steps", "7", "--checkpoint-dir", "/c", "--checkpoint-every", "3", "--snapshots"}, &bytes.Buffer{})
	if err != nil || cfg.Steps != 7 || cfg.CheckpointDir != "/c" || cfg.CheckpointEvery != 3 || !cfg.Snapshots {
		t.Fatalf("parseFlags: %+v, %v", cfg, err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--steps", "0"}, "--steps 0"},
		{[]string{"--lr", "0"}, "--lr 0"},
		{[]string{"--momentum", "1"}, "--momentum 1"},
		{[]string{"--checkpoint-every", "0"}, "--checkpoint-every 0"},
		{[]string{"extra"}, `unexpected arguments ["extra"]`},
	} {
		_, err := parseFlags(tc.args, &bytes.Buffer{})
		if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "see --help") {
			t.Errorf("parseFlags(%q): %v; want an error naming %q and pointing at --help", tc.args, err, tc.want)
		}
	}
	var help bytes.Buffer
	if _, err := parseFlags([]string{"--help"}, &help); !errors.Is(err, flag.ErrHelp) || !strings.Contains(help.String(), "Examples:\n  gotrain launch") {
		t.Errorf("--help: %v\n%s", err, help.String())
	}
}
