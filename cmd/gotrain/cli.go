package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
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
	return []command{&launchCmd{}, &torchrunCmd{}, &coordinatorCmd{}, &benchCmd{}, &topoCmd{}, &doctorCmd{}, &diagnoseCmd{}, &topCmd{}, &versionCmd{}}
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

// gotrain's exit statuses of its own (a job's status is its failed rank's):
// 0 success or help, 1 a failure, 2 a usage error (bad flags or arguments,
// always with a message on stderr). `gotrain diagnose` exits 3 when it
// reports a hang (exitHang).
const (
	exitFailure = 1
	exitUsage   = 2
)

func run(ctx context.Context, args []string) int {
	if len(args) == 0 {
		printUsage(os.Stderr)
		return exitUsage
	}
	if args[0] == "help" || args[0] == "-h" || args[0] == "--help" || args[0] == "-help" {
		if len(args) > 1 {
			return run(ctx, []string{args[1], "--help"})
		}
		printUsage(os.Stdout)
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
			return exitUsage
		}
		if msg := err.Error(); msg != "" { // "": the command's output said it
			fmt.Fprintln(os.Stderr, msg)
		}
		var ec exitCoder
		if errors.As(err, &ec) {
			return ec.ExitCode()
		}
		return exitFailure
	}
	fmt.Fprintf(os.Stderr, "gotrain: unknown command %q\nRun 'gotrain help' for the list of commands.\n", args[0])
	return exitUsage
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

// newFlagSet returns a FlagSet whose --help prints usage then the flags, on
// stdout (parseFlags).
func newFlagSet(name, usage string) *flag.FlagSet {
	fs := flag.NewFlagSet("gotrain "+name, flag.ContinueOnError)
	fs.SetOutput(os.Stdout)
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), strings.TrimSpace(usage))
		n := 0
		fs.VisitAll(func(*flag.Flag) { n++ })
		if n > 0 {
			fmt.Fprintln(fs.Output())
			fmt.Fprintln(fs.Output(), "Flags:")
			fs.VisitAll(func(f *flag.Flag) { printFlag(fs.Output(), f) }) // help.go
		}
	}
	return fs
}

// parseFlags parses args, turning flag errors into usage errors; --help
// prints the usage on stdout and returns flag.ErrHelp (exit 0). A switch
// followed by one of its words (--standby off, --json false) takes it, as if
// written --standby=off: see joinFlagWords.
func parseFlags(fs *flag.FlagSet, args []string) error {
	fs.SetOutput(io.Discard)
	err := fs.Parse(joinFlagWords(fs, args))
	fs.SetOutput(os.Stdout)
	if errors.Is(err, flag.ErrHelp) {
		fs.Usage()
		return err
	}
	if err != nil {
		return flagError(fs, err, args)
	}
	if f := fs.Lookup(helpAll); f != nil && f.Value.String() == "true" {
		fullUsage[fs]()
		return flag.ErrHelp
	}
	return nil
}

// wordFlag is a flag that may be given bare (a switch: IsBoolFlag) and also
// takes one of a few words: --standby is on, --standby=off, --standby off.
type wordFlag interface {
	flag.Value
	IsBoolFlag() bool
	Words() []string
}

// joinFlagWords rewrites a switch followed by one of its words into one
// argument ("--standby", "off" -> "--standby=off"; "--json", "false" ->
// "--json=false"), so that the word is not taken for the program or a
// positional argument. Boolean flags take true and false; a wordFlag its
// Words. It stops where flag parsing stops: at "--" or the first argument
// that is neither a flag nor a flag's value.
func joinFlagWords(fs *flag.FlagSet, args []string) []string {
	out := make([]string, 0, len(args))
	for i := 0; i < len(args); i++ {
		a := args[i]
		out = append(out, a)
		if a == "--" || len(a) < 2 || a[0] != '-' {
			return append(out, args[i+1:]...)
		}
		if d := dashSpelling(fs, a); d != a { // --nproc_per_node: --nproc-per-node
			a, out[len(out)-1] = d, d
		}
		name := strings.TrimPrefix(strings.TrimPrefix(a, "-"), "-")
		if strings.Contains(name, "=") {
			continue
		}
		f := fs.Lookup(name)
		if f == nil || i+1 == len(args) {
			continue
		}
		words := flagWords(f)
		if words == nil { // takes a value: skip it
			i++
			out = append(out, args[i])
			continue
		}
		for _, w := range words {
			if args[i+1] == w {
				out[len(out)-1] = a + "=" + w
				i++
				break
			}
		}
	}
	return out
}

// dashSpelling returns flag argument a with the underscores of its name
// turned into dashes (--nproc_per_node=2: --nproc-per-node=2), as torchrun
// users write them, when fs has the dashed flag and not the underscored one;
// otherwise a.
func dashSpelling(fs *flag.FlagSet, a string) string {
	rest := strings.TrimLeft(a, "-")
	name, value, hasValue := strings.Cut(rest, "=")
	dashed := strings.ReplaceAll(name, "_", "-")
	if dashed == name || fs.Lookup(name) != nil || fs.Lookup(dashed) == nil {
		return a
	}
	if hasValue {
		dashed += "=" + value
	}
	return a[:len(a)-len(rest)] + dashed
}

// flagWords returns the words a switch takes, or nil for a flag that takes
// a value.
func flagWords(f *flag.Flag) []string {
	if w, ok := f.Value.(wordFlag); ok && w.IsBoolFlag() {
		return w.Words()
	}
	if b, ok := f.Value.(interface{ IsBoolFlag() bool }); ok && b.IsBoolFlag() {
		return []string{"true", "false"}
	}
	return nil
}

// checkPort says what a port flag allows: 0 (any free port) to 65535.
func checkPort(flagName string, port int) error {
	if port < 0 || port > 65535 {
		return &usageError{msg: fmt.Sprintf("%s %d", flagName, port), hint: "Give a port from 1 to 65535, or 0 for any free port."}
	}
	return nil
}

// checkHostPort checks a HOST:PORT flag's value ("" is left out): a port
// from 0 (any free port, unless needPort) to 65535.
func checkHostPort(flagName, addr string, needPort bool) error {
	if addr == "" {
		return nil
	}
	example := "e.g. " + flagName + " 10.0.0.1:29400"
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		return &usageError{msg: fmt.Sprintf("%s %q is not HOST:PORT", flagName, addr), hint: "Give HOST:PORT, " + example + "."}
	}
	port, err := strconv.Atoi(p)
	low := 0
	if needPort {
		low = 1
	}
	if err != nil || port < low || port > 65535 {
		return &usageError{msg: fmt.Sprintf("%s %q: port %q", flagName, addr, p), hint: fmt.Sprintf("Give a port from %d to 65535, %s.", low, example)}
	}
	return nil
}

// defaultCoordinatorPort is the port of --coordinator HOST: torchrun's
// rendezvous port convention, and gotrain's --coordinator-listen default.
const defaultCoordinatorPort = "29400"

// withDefaultPort gives each of addr's comma-separated entries (HOST or
// HOST:PORT: a replicated coordinator's replicas; "" stays "") the
// coordinator's default port when it has none.
func withDefaultPort(addr string) string {
	if addr == "" {
		return ""
	}
	entries := strings.Split(addr, ",")
	for i, a := range entries {
		a = strings.TrimSpace(a)
		if _, _, err := net.SplitHostPort(a); err != nil && a != "" {
			a = net.JoinHostPort(strings.Trim(a, "[]"), defaultCoordinatorPort)
		}
		entries[i] = a
	}
	return strings.Join(entries, ",")
}
