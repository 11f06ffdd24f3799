package kv

import (
	"testing"

	"github.com/gotrain/gotrain/internal/testing/deptest"
)

// The store is data in the coordinator's pure state: no locks, channels or
// clocks (readers wait in the server, package kvwait).
func TestStoreIsPure(t *testing.T) {
	deptest.Check(t, "the key-value store", []string{"bytes", "errors", "fmt", "maps", "slices"})
}
