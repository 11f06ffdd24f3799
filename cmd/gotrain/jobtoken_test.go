package main

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gotrain/gotrain/internal/coordinator/host"
	"github.com/gotrain/gotrain/internal/launcher"
)

func tokenFile(t *testing.T, content string, mode os.FileMode) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, mode); err != nil {
		t.Fatal(err)
	}
	return p
}

// --job-token-file: read from a file only its owner can read; any other
// file is refused with a usage error that says what to do.
func TestJobTokenFile(t *testing.T) {
	good := tokenFile(t, "s3cret\n", 0o600)
	for _, tc := range []struct {
		name    string
		args    []string
		want    string // the token; "" for an error
		errWant string
		warn    bool
	}{
		{name: "file", args: []string{"--job-token-file", good}, want: "s3cret"},
		{name: "readable by others", args: []string{"--job-token-file", tokenFile(t, "s3cret", 0o644)}, errWant: "chmod 600"},
		{name: "readable by group", args: []string{"--job-token-file", tokenFile(t, "s3cret", 0o640)}, errWant: "chmod 600"},
		{name: "empty", args: []string{"--job-token-file", tokenFile(t, "\n", 0o600)}, errWant: "empty"},
		{name: "two words", args: []string{"--job-token-file", tokenFile(t, "a b", 0o600)}, errWant: "more than one word"},
		{name: "missing", args: []string{"--job-token-file", filepath.Join(t.TempDir(), "none")}, errWant: "no such file"},
		{name: "directory", args: []string{"--job-token-file", t.TempDir()}, errWant: "not a regular file"},
		{name: "both", args: []string{"--job-token", "x", "--job-token-file", good}, errWant: "both given"},
		{name: "argv warns", args: []string{"--job-token", "x"}, want: "x", warn: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var cfg launcher.Config
			fs := launchFlags(&cfg, new(launchOpts))
			if err := fs.Parse(append(tc.args, "--", "prog")); err != nil {
				t.Fatal(err)
			}
			var stderr bytes.Buffer
			err := applyJobToken(fs, &cfg.JobSettings, &stderr)
			if tc.errWant != "" {
				var ue *usageError
				if !errors.As(err, &ue) || !strings.Contains(err.Error(), tc.errWant) {
					t.Fatalf("err = %v; want a usage error with %q", err, tc.errWant)
				}
				return
			}
			if err != nil || cfg.JobToken != tc.want {
				t.Fatalf("token %q, err %v; want %q", cfg.JobToken, err, tc.want)
			}
			if got := strings.Contains(stderr.String(), "visible to every user"); got != tc.warn {
				t.Errorf("warned %v, want %v: %q", got, tc.warn, stderr.String())
			}
		})
	}
}

// gotrain coordinator takes --job-token-file too.
func TestCoordinatorJobTokenFile(t *testing.T) {
	var cfg host.Config
	fs := coordinatorFlags(&cfg, new(string))
	if err := fs.Parse([]string{"--job-token-file", tokenFile(t, "c0ord", 0o400)}); err != nil {
		t.Fatal(err)
	}
	if err := applyJobToken(fs, &cfg.JobSettings, &bytes.Buffer{}); err != nil || cfg.JobToken != "c0ord" {
		t.Fatalf("token %q, err %v", cfg.JobToken, err)
	}
}
