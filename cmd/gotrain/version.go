package main

import (
	"context"
	"fmt"
	"runtime/debug"
)

type versionCmd struct{}

func (*versionCmd) name() string     { return "version" }
func (*versionCmd) synopsis() string { return "print gotrain's version" }

func (c *versionCmd) run(_ context.Context, args []string) error {
	fs := newFlagSet(c.name(), "Usage: gotrain version\n\nPrints the version gotrain was built from.")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return &usageError{msg: fmt.Sprintf("unexpected argument %q", fs.Arg(0))}
	}
	v := "(devel)"
	if bi, ok := debug.ReadBuildInfo(); ok {
		v = bi.Main.Version
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" {
				v += " " + s.Value
			}
		}
		v += " " + bi.GoVersion
	}
	fmt.Println("gotrain", v)
	return nil
}
