package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
)

// command is one `gotrain` subcommand.
type command interface {
	name() string
	synopsis() string
	// run executes the command; errors are printed by run's caller.
	run(ctx context.Context, args []string) error
}

func commands() []command {
	return []command{&launchCmd{}, &coordinatorCmd{}, &benchCmd{}, &topoCmd{}, &doctorCmd{}, &diagnoseCmd{}, &topCmd{}, &versionCmd{}}
}

// usageError is bad input: the message and what to do about it.
type usageError struct{ msg, hint string }

func (e *usageError) Error() string {
	if e.hint == "" {
		return e.msg
	}
	return e.msg + "\n" + e.hint
}

// exitCoder is an error that decides gotrain's exit status.
type exitCoder interface{ ExitCode() int }

func run(ctx context.Context, args []string) int {
	if len(args) == 0 || args[0] == "help" || args[0] == "-h" || args[0] == "--help" || args[0] == "-help" {
		if len(args) > 1 {
			return run(ctx, []string{args[1], "--help"})
		}
		printUsage(os.Stdout)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	for _, c := range commands() {
		if c.name() != args[0] {
			continue
		}
		err := c.run(ctx, args[1:])
		switch {
		case err == nil:
			return 0
		case errors.Is(err, flag.ErrHelp):
			return 0
		}
		var ue *usageError
		if errors.As(err, &ue) {
			fmt.Fprintf(os.Stderr, "gotrain %s: %v\nRun 'gotrain %s --help' for usage.\n", c.name(), err, c.name())
			return 2
		}
		fmt.Fprintln(os.Stderr, err)
		var ec exitCoder
		if errors.As(err, &ec) {
			return ec.ExitCode()
		}
		return 1
	}
	fmt.Fprintf(os.Stderr, "gotrain: unknown command %q\nRun 'gotrain help' for the list of commands.\n", args[0])
	return 2
}

func printUsage(w io.Writer) {
	fmt.Fprintln(w, "gotrain runs data-parallel training jobs on NVIDIA GPUs, from one box to a cluster.")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Usage: gotrain <command> [flags] [args]")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Commands:")
	for _, c := range commands() {
		fmt.Fprintf(w, "  %-12s %s\n", c.name(), c.synopsis())
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Run 'gotrain <command> --help' for a command's flags.")
}

// newFlagSet returns a FlagSet whose --help prints usage then the flags.
func newFlagSet(name, usage string) *flag.FlagSet {
	fs := flag.NewFlagSet("gotrain "+name, flag.ContinueOnError)
	fs.SetOutput(os.Stderr)
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), strings.TrimSpace(usage))
		fmt.Fprintln(fs.Output())
		fmt.Fprintln(fs.Output(), "Flags:")
		fs.PrintDefaults()
	}
	return fs
}

// parseFlags parses args, turning flag errors into usage errors.
func parseFlags(fs *flag.FlagSet, args []string) error {
	fs.SetOutput(io.Discard)
	err := fs.Parse(args)
	fs.SetOutput(os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		fs.Usage()
		return err
	}
	if err != nil {
		return &usageError{msg: err.Error()}
	}
	return nil
}
