package launcher

import "github.com/gotrain/gotrain/internal/connguard"

// maxAgentSocketConns bounds the connections to the agent's socket (issue
// 24, item 4): only the agent's user reaches it (a 0700 directory,
// sockdir.go), so every connection counts as authenticated; the bound
// keeps a runaway worker from spending the agent's descriptors. Up to 1024
// workers a node (coordinator.MaxNprocPerNode), each with a connection or
// two, and the standbys'.
const maxAgentSocketConns = 4096

var agentSocketLimits = connguard.Limits{Authenticated: maxAgentSocketConns}
