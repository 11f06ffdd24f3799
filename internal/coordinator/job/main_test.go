package job

import (
	"testing"

	"go.uber.org/goleak"
)

// The machine starts no goroutine; goleak keeps it so.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
