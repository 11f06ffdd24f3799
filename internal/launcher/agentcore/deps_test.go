package agentcore

import (
	"testing"

	"github.com/gotrain/gotrain/internal/testing/deptest"
)

// The agent machine is pure: it takes time as an argument, talks to
// nothing and starts nothing. (syscall only for the Signal type and its
// constants; jobenv only for the identity of a rank.)
func TestMachineIsPure(t *testing.T) {
	deptest.Check(t, "the agent machine", []string{"cmp", "errors", "fmt", "maps", "slices", "sort", "strconv", "strings", "syscall", "time",
		"github.com/gotrain/gotrain/internal/jobenv"})
}
