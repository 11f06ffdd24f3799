package relay

import (
	"log/slog"
	"net"

	"github.com/gotrain/gotrain/internal/connguard"
)

// maxAgentSocketConns bounds the connections to the agent's socket (issue
// 24, item 4): only the agent's user reaches it (a 0700 directory,
// sockdir.go), so every connection counts as authenticated; the bound
// keeps a runaway worker from spending the agent's descriptors. Up to 1024
// workers a node (coordinator.MaxNprocPerNode), each with a connection or
// two, and the standbys'.
const maxAgentSocketConns = 4096

var agentSocketLimits = connguard.Limits{Authenticated: maxAgentSocketConns}

// Listen listens on the agent's socket at path, within its bounds.
func Listen(path string, log *slog.Logger) (net.Listener, error) {
	lis, err := net.Listen("unix", path)
	if err != nil {
		return nil, err
	}
	return connguard.Listen(lis, "the agent's socket", agentSocketLimits, log), nil
}
