// Package gputest is how GPU tests skip when the machine lacks what they
// need (a CUDA driver, GPUs, NCCL or one of its features), and how the GPU
// machine makes sure they did not.
//
// On a machine without GPUs, CI runs every GPU test and each one skips,
// saying why. On the GPU machine, bench/gpu_check.sh sets
// GOTRAIN_REQUIRE_GPU=1, and then every such skip is a failure instead: a
// GPU test that did not run there is a missing result, not a pass.
//
// Usage, where a test used to call t.Skipf:
//
//	drv, err := cudadrv.Load()
//	if err != nil {
//		gputest.Skipf(t, "needs the CUDA driver: %v", err)
//	}
//
// Skips for reasons other than missing GPU hardware or software (a test for
// machines without a driver, a test that needs the go tool) keep t.Skip.
package gputest

import (
	"fmt"
	"os"
	"testing"
)

// RequireEnv is the environment variable that turns GPU skips into failures
// when set to 1.
const RequireEnv = "GOTRAIN_REQUIRE_GPU"

// Required reports whether GPU tests must run here (RequireEnv=1).
func Required() bool { return os.Getenv(RequireEnv) == "1" }

// Skip skips the test because the machine lacks something a GPU test needs,
// or, with RequireEnv=1, fails it and stops it.
func Skip(t testing.TB, args ...any) {
	t.Helper()
	skip(t, fmt.Sprint(args...))
}

// Skipf is Skip with a format.
func Skipf(t testing.TB, format string, args ...any) {
	t.Helper()
	skip(t, fmt.Sprintf(format, args...))
}

func skip(t testing.TB, reason string) {
	t.Helper()
	if Required() {
		t.Fatalf("%s=1, so this GPU test must run, but it would skip: %s", RequireEnv, reason)
	}
	t.Skip(reason)
}
