package rhythm

import (
	"testing"

	"github.com/gotrain/gotrain/internal/testing/deptest"
)

// The rhythm is pure: samples carry their time; it reads no clock and talks
// to nothing.
func TestRhythmIsPure(t *testing.T) {
	deptest.Check(t, "the rhythm package", []string{"cmp", "errors", "maps", "slices", "time"})
}
