package main

import (
	"bytes"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/gotrain/gotrain/internal/coordinator/host"
	"github.com/gotrain/gotrain/internal/jobenv"
)

// The job token reaches gotrain launch and gotrain coordinator three ways:
// --job-token-file FILE (a file only its owner can read), $GOTRAIN_JOB_TOKEN,
// or --job-token TOKEN, kept for compatibility with a warning: any user of
// the machine reads a process's argv (ps, /proc/PID/cmdline). gotrain puts
// the token in no process's argv itself: workers get it in their
// environment, the orphan reaper not at all.

// FlagJobTokenFile is the name of --job-token-file.
const FlagJobTokenFile = "job-token-file"

// maxTokenFile bounds what --job-token-file reads.
const maxTokenFile = 4 << 10

// registerJobTokenFile registers --job-token-file on fs.
func registerJobTokenFile(fs *flag.FlagSet) {
	fs.String(FlagJobTokenFile, "", "read the job token from FILE (mode 0600: readable by you alone), so that it appears in no process's argv; or set $"+jobenv.JobToken)
}

// applyJobToken puts the token of fs's --job-token-file, when given, into
// s, and warns on stderr about a --job-token given on the command line.
func applyJobToken(fs *flag.FlagSet, s *host.JobSettings, stderr io.Writer) error {
	path := ""
	if f := fs.Lookup(FlagJobTokenFile); f != nil {
		path = f.Value.String()
	}
	inArgv := false
	fs.Visit(func(f *flag.Flag) { inArgv = inArgv || f.Name == host.FlagJobToken })
	if path == "" {
		if inArgv {
			fmt.Fprintf(stderr, "gotrain: warning: --job-token on the command line is visible to every user of this machine (ps, /proc/PID/cmdline); use --job-token-file FILE (mode 0600) or set %s instead\n", jobenv.JobToken)
		}
		return nil
	}
	if inArgv {
		return &usageError{msg: "--job-token and --job-token-file both given", hint: "Give one: --job-token-file FILE keeps the token out of ps."}
	}
	tok, err := readJobTokenFile(path)
	if err != nil {
		return err
	}
	s.JobToken = tok
	return nil
}

// readJobTokenFile reads a token file: a regular file that no one but its
// owner may read or write (the check is on the file opened, so that a file
// swapped after it cannot pass), holding the token and maybe a newline.
func readJobTokenFile(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", &usageError{msg: fmt.Sprintf("--job-token-file: %v", err), hint: "Give a file holding the job token, e.g. one written with: (umask 077; echo TOKEN > ~/.gotrain-token)"}
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return "", fmt.Errorf("--job-token-file %s: %w", path, err)
	}
	if !st.Mode().IsRegular() {
		return "", &usageError{msg: fmt.Sprintf("--job-token-file %s is not a regular file", path), hint: "Give a file holding the job token."}
	}
	if perm := st.Mode().Perm(); perm&0o077 != 0 {
		return "", &usageError{msg: fmt.Sprintf("--job-token-file %s is readable or writable by other users (mode %#o)", path, perm), hint: fmt.Sprintf("Make it yours alone: chmod 600 %s", path)}
	}
	b, err := io.ReadAll(io.LimitReader(f, maxTokenFile+1))
	if err != nil {
		return "", fmt.Errorf("--job-token-file %s: %w", path, err)
	}
	tok := string(bytes.TrimSpace(b))
	switch {
	case len(b) > maxTokenFile:
		return "", &usageError{msg: fmt.Sprintf("--job-token-file %s is over %d bytes", path, maxTokenFile), hint: "It should hold the job token alone."}
	case tok == "":
		return "", &usageError{msg: fmt.Sprintf("--job-token-file %s is empty", path), hint: "Write the job token into it."}
	case bytes.ContainsAny([]byte(tok), "\n\r\t "):
		return "", &usageError{msg: fmt.Sprintf("--job-token-file %s holds more than one word", path), hint: "It should hold the job token alone."}
	}
	return tok, nil
}
