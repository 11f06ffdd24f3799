package main

import (
	"flag"
	"strings"
	"testing"

	"github.com/gotrain/gotrain/internal/launcher"
)

// gotrain's own flags take torchrun's underscore spelling too; the
// program's arguments are left as they are.
func TestUnderscoreSpellings(t *testing.T) {
	for _, tc := range []struct{ args, want string }{
		{"--nproc_per_node 2 --max_restarts=1 -- ./t --log_dir x", "--nproc-per-node 2 --max-restarts=1 -- ./t --log_dir x"},
		{"-nproc_per_node=2 --standby off ./t --nproc_per_node 3", "-nproc-per-node=2 --standby=off ./t --nproc_per_node 3"},
		{"--no_such_flag 1", "--no_such_flag 1"},
		{"--log-dir --max_restarts", "--log-dir --max_restarts"}, // a value, not a flag
	} {
		var cfgVerbose bool
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		fs.Int("nproc-per-node", 0, "")
		fs.Int("max-restarts", 0, "")
		fs.String("log-dir", "", "")
		fs.BoolVar(&cfgVerbose, "verbose", false, "")
		standby := standbyFlag("auto")
		fs.Var(&standby, "standby", "")
		if got := strings.Join(joinFlagWords(fs, strings.Fields(tc.args)), " "); got != tc.want {
			t.Errorf("joinFlagWords(%s)\n got %s\nwant %s", tc.args, got, tc.want)
		}
	}
}

// Through gotrain launch's own FlagSet: parsed as the dashed flags.
func TestLaunchUnderscoreFlags(t *testing.T) {
	fs := launchFlags(new(launcher.Config), new(launchOpts))
	if err := parseFlags(fs, strings.Fields("--nproc_per_node=3 --max_restarts 2 --log_dir /tmp/x -- ./t")); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]string{"nproc-per-node": "3", "max-restarts": "2", "log-dir": "/tmp/x"} {
		if got := fs.Lookup(name).Value.String(); got != want {
			t.Errorf("--%s = %s, want %s", name, got, want)
		}
	}
}
