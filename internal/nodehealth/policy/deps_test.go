package policy

import (
	"testing"

	"github.com/gotrain/gotrain/internal/testing/deptest"
)

// The policy is pure: the coordinator's replicated state decides with it.
func TestPolicyIsPure(t *testing.T) {
	deptest.Check(t, "the node-health policy", []string{"fmt", "slices", "time"})
}
