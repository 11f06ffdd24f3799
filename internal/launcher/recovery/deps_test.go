package recovery

import (
	"testing"

	"github.com/gotrain/gotrain/internal/testing/deptest"
)

// The decision is pure: timestamps in, phases out; no clock, no files.
func TestDecisionIsPure(t *testing.T) {
	deptest.Check(t, "the recovery decision", []string{"fmt", "slices", "strings", "time"})
}
