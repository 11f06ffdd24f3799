package kv

import (
	"testing"

	"go.uber.org/goleak"
)

// The store starts no goroutine: a Wait that gave up returns, and the
// tests' waiters all end.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
