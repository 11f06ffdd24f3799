package main

import (
	"os/exec"
	"runtime/debug"
	"strings"
	"testing"
)

func TestVersionLine(t *testing.T) {
	bi := &debug.BuildInfo{GoVersion: "go1.25.1", Main: debug.Module{Version: "(devel)"}, Settings: []debug.BuildSetting{
		{Key: "vcs.revision", Value: "4162240abc"}, {Key: "vcs.modified", Value: "true"}, {Key: "vcs.time", Value: "2026-12-02T03:00:00Z"}}}
	if got, want := versionLine("", bi, true), "gotrain (devel) commit 4162240abc (modified) from 2026-12-02T03:00:00Z go1.25.1"; got != want {
		t.Errorf("got %q\nwant %q", got, want)
	}
	if got, want := versionLine("", &debug.BuildInfo{GoVersion: "go1.25.1", Main: debug.Module{Version: "v1.2.0"}}, true), "gotrain v1.2.0 commit unknown go1.25.1"; got != want {
		t.Errorf("got %q\nwant %q", got, want)
	}
	if got, want := versionLine("0.9.0", bi, true), "gotrain 0.9.0 (release build) go1.25.1"; got != want {
		t.Errorf("release build: got %q\nwant %q", got, want)
	}
}

// The binary names the commit its build information holds (go version -m),
// "unknown" when it holds none (built with -buildvcs=false, as GOFLAGS may
// say, or outside a checkout).
func TestVersionNamesCommit(t *testing.T) {
	bin := buildBinary(t)
	out, err := exec.Command("go", "version", "-m", bin).Output()
	if err != nil {
		t.Fatal(err)
	}
	rev := "unknown"
	for _, l := range strings.Split(string(out), "\n") {
		if f := strings.Fields(l); len(f) == 2 && f[0] == "build" && strings.HasPrefix(f[1], "vcs.revision=") {
			rev = strings.TrimPrefix(f[1], "vcs.revision=")
		}
	}
	stdout, stderr, code := runGotrain(t, bin, "version")
	if code != 0 || stderr != "" || !strings.HasPrefix(stdout, "gotrain ") || !strings.Contains(stdout, " commit "+rev) {
		t.Errorf("gotrain version: exit %d, stdout %q, stderr %q; want the commit %s", code, stdout, stderr, rev)
	}
}
