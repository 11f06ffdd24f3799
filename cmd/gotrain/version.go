package main

import (
	"context"
	"fmt"
	"runtime/debug"

	"github.com/gotrain/gotrain/python"
)

// release is the version a release build stamps in (make dist, make wheel:
// -ldflags "-X main.release=0.9.0"); empty in a build from a checkout.
var release string

type versionCmd struct{}

func (*versionCmd) name() string     { return "version" }
func (*versionCmd) synopsis() string { return "print gotrain's version" }

func (c *versionCmd) run(_ context.Context, args []string) error {
	fs := newFlagSet(c.name(), "Usage: gotrain version\n\nPrints the version gotrain was built from: the module version, the VCS commit\n(and whether the tree was modified), its time, and the Go version; then the\nversion of the Python package gotrain its agents give their workers.\n\nExamples:\n  gotrain version\n  python -m gotrain version   # the one a pip-installed wheel put on PATH")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return &usageError{msg: fmt.Sprintf("unexpected argument %q", fs.Arg(0))}
	}
	bi, ok := debug.ReadBuildInfo()
	fmt.Println(versionLine(release, bi, ok))
	// The Python package the agent puts on its workers' path: an installed
	// one of another version shadows it.
	fmt.Printf("python package gotrain %s\n", python.Version)
	return nil
}

// versionLine is `gotrain version`'s line. A release build says its
// release and Go version: "gotrain 0.9.0 (release build) go1.26.8". Else it
// is the module's version, the VCS
// revision the binary was built from (", modified" when the tree had
// uncommitted changes) and the Go version: "gotrain (devel) commit 4162240…
// (modified) go1.25.1". A binary built without VCS information says "commit
// unknown".
func versionLine(release string, bi *debug.BuildInfo, ok bool) string {
	if release != "" {
		goVersion := "go (unknown)"
		if ok {
			goVersion = bi.GoVersion
		}
		return "gotrain " + release + " (release build) " + goVersion
	}
	if !ok {
		return "gotrain (unknown version: no build information)"
	}
	v := bi.Main.Version
	if v == "" {
		v = "(devel)"
	}
	rev, modified, at := "unknown", false, ""
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			modified = s.Value == "true"
		case "vcs.time":
			at = s.Value
		}
	}
	line := "gotrain " + v + " commit " + rev
	if modified {
		line += " (modified)"
	}
	if at != "" {
		line += " from " + at
	}
	return line + " " + bi.GoVersion
}
