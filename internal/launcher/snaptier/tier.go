// Package snaptier is the agent's side of the in-memory snapshot tier: the
// agent keeps each local rank's newest training state in memory that
// outlives the worker (internal/memsnap serves it on a socket beside the
// workers' gRPC socket), replicates it to its ring neighbour's agent and
// fetches a replaced rank's from peers (peers.go), so that a restarted rank
// or a replaced node resumes from its last step instead of its last disk
// checkpoint. It is apart from the agent because none of it takes part in
// the agent's decisions: the agent starts it, tells it each generation, and
// puts its Python module on the workers' path.
package snaptier

import (
	"os"
	"slices"
	"strings"

	"github.com/gotrain/gotrain/internal/memsnap"
)

// PythonPath appends dir (none when "") to env's PYTHONPATH: last, so that
// the program's own modules come first.
func PythonPath(env []string, dir string) []string {
	if dir == "" {
		return env
	}
	for i := len(env) - 1; i >= 0; i-- {
		if v, ok := strings.CutPrefix(env[i], "PYTHONPATH="); ok {
			if v != "" {
				dir = v + string(os.PathListSeparator) + dir
			}
			out := slices.Clone(env)
			out[i] = "PYTHONPATH=" + dir
			return out
		}
	}
	return append(env, "PYTHONPATH="+dir)
}

// DefaultMemory is --snapshot-memory's default: a quarter of the node's
// memory.
func DefaultMemory() int64 {
	if n := memsnap.TotalMemory(); n > 0 {
		return n / 4
	}
	return 16 << 30
}
