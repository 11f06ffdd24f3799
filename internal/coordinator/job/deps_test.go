package job

import (
	"testing"

	"github.com/gotrain/gotrain/internal/testing/deptest"
)

// The machine is pure: it takes time as an argument and talks to nothing.
func TestMachineIsPure(t *testing.T) {
	deptest.Check(t, "the job machine", []string{"cmp", "errors", "fmt", "maps", "slices", "sort", "strconv", "strings", "time", "github.com/gotrain/gotrain/internal/coordinator/rhythm"})
}
