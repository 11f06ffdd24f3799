package main

import (
	"errors"
	"flag"
	"strings"
	"testing"

	"github.com/gotrain/gotrain/internal/coordinator/host"
	"github.com/gotrain/gotrain/internal/jobenv"
	"github.com/gotrain/gotrain/internal/launcher"
)

// The job-wide flags of gotrain launch and gotrain coordinator are the same
// flags: same names, help and defaults, and the same settings once parsed
// with no arguments.
func TestJobFlagsAgree(t *testing.T) {
	t.Setenv(jobenv.JobToken, "tok-from-env")
	var lcfg launcher.Config
	launch := launchFlags(&lcfg, new(launchOpts))
	var ccfg host.Config
	coord := coordinatorFlags(&ccfg, new(string))

	jobFlags := flag.NewFlagSet("job", flag.ContinueOnError)
	host.RegisterJobFlags(jobFlags, new(host.JobSettings), "tok-from-env")
	n := 0
	jobFlags.VisitAll(func(want *flag.Flag) {
		n++
		for name, fs := range map[string]*flag.FlagSet{"launch": launch, "coordinator": coord} {
			got := fs.Lookup(want.Name)
			if got == nil {
				t.Errorf("gotrain %s has no --%s", name, want.Name)
				continue
			}
			if got.DefValue != want.DefValue || got.Usage != want.Usage {
				t.Errorf("gotrain %s --%s: default %q, help %q; want %q, %q", name, want.Name, got.DefValue, got.Usage, want.DefValue, want.Usage)
			}
		}
	})
	if n == 0 {
		t.Fatal("no job-wide flags")
	}
	if d := launch.Lookup(host.FlagMaxRestarts).DefValue; d != "3" {
		t.Errorf("--max-restarts defaults to %s, want 3", d)
	}
	if err := launch.Parse(nil); err != nil {
		t.Fatal(err)
	}
	if err := coord.Parse(nil); err != nil {
		t.Fatal(err)
	}
	if lcfg.JobSettings != ccfg.JobSettings {
		t.Errorf("parsed with no arguments:\n launch      %+v\n coordinator %+v", lcfg.JobSettings, ccfg.JobSettings)
	}
	if lcfg.JobToken != "tok-from-env" {
		t.Errorf("token %q, want $%s's", lcfg.JobToken, jobenv.JobToken)
	}
}

// Both commands refuse the same bad job-wide settings with the same usage
// error, before they start anything.
func TestJobFlagsValidated(t *testing.T) {
	for _, tc := range []struct {
		args []string
		msg  string
	}{
		{[]string{"--on-hang", "never"}, `--on-hang "never"`},
		{[]string{"--on-straggler", "never"}, `--on-straggler "never"`},
		{[]string{"--hang-timeout", "-1s"}, "--hang-timeout -1s"},
		{[]string{"--max-restarts", "-1"}, "--max-restarts -1"},
		{[]string{"--nnodes", "0"}, "--nnodes"}, // a parse error: N or MIN:MAX
		{[]string{"--restart-backoff", "-1s"}, "--restart-backoff -1s"},
		{[]string{"--rendezvous-timeout", "-1s"}, "--rendezvous-timeout -1s"},
	} {
		for _, cmd := range []struct {
			c    command
			args []string
		}{
			{&coordinatorCmd{}, tc.args},
			{&launchCmd{}, append(append([]string{}, tc.args...), "--", "./train")},
		} {
			err := cmd.c.run(t.Context(), cmd.args)
			var ue *usageError
			ok := errors.As(err, &ue) && ue.msg == tc.msg && ue.hint != ""
			if tc.msg == "--nnodes" { // refused while parsing, saying what it takes
				ok = errors.As(err, &ue) && strings.Contains(err.Error(), "MIN:MAX")
			}
			if !ok {
				t.Errorf("gotrain %s %s = %v, want the usage error %q with a hint", cmd.c.name(), strings.Join(cmd.args, " "), err, tc.msg)
			}
		}
	}
}

// --coordinator HOST means port 29400.
func TestCoordinatorDefaultPort(t *testing.T) {
	for in, want := range map[string]string{"": "", "node1": "node1:29400", "10.0.0.1": "10.0.0.1:29400",
		"10.0.0.1:1234": "10.0.0.1:1234", "::1": "[::1]:29400", "[::1]:5": "[::1]:5", "[fe80::1]": "[fe80::1]:29400",
		"10.0.0.1:1,10.0.0.2:2,10.0.0.3:3": "10.0.0.1:1,10.0.0.2:2,10.0.0.3:3", "a,b:5, c": "a:29400,b:5,c:29400"} {
		if got := withDefaultPort(in); got != want {
			t.Errorf("withDefaultPort(%q) = %q, want %q", in, got, want)
		}
	}
}
