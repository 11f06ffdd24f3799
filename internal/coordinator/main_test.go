package coordinator

import (
	"testing"

	"go.uber.org/goleak"
)

// Every goroutine a Server starts — its gRPC server, the ticker, the
// proposer, probes, deadline timers that fired, gossip's — has ended once
// Serve returned and gossip stopped.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
