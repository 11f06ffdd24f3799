package state

import (
	"testing"

	"github.com/gotrain/gotrain/internal/testing/deptest"
)

// The state is pure: time comes with the entries, and it talks to nothing.
func TestStateIsPure(t *testing.T) {
	deptest.Check(t, "the coordinator's replicated state", []string{
		"cmp", "crypto/sha256", "encoding/json", "errors", "fmt", "maps", "slices", "strconv", "strings", "time", "unicode/utf8",
		"github.com/gotrain/gotrain/internal/coordinator/job", "github.com/gotrain/gotrain/internal/coordinator/kv",
		"github.com/gotrain/gotrain/internal/nodehealth/policy",
	})
}
