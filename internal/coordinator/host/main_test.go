package host

import (
	"testing"

	"go.uber.org/goleak"
)

// Stop joins everything Start started; the replicated tests too, whose
// replicas apply the log (timers, probes, voter changes) while they run.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
