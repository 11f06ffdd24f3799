package relay

import (
	"context"
	"fmt"
	"os"
	"sync"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// The relay's stream budget. Every call a worker makes through the agent
// (KVPut, KVGet, Barrier, ReportProgress) is a stream on the agent's one
// connection to the coordinator, which admits a bounded number of streams
// a connection (internal/coordinator/limits.go: 2 x MaxNprocPerNode + 64). One
// worker's long polls — KVGets of a key that never comes, from thousands of
// threads — once took them all: the agent's own calls (a worker's exit,
// its reports) queued behind them, and at the next crash the node was cut
// off and the job failed. Now each worker may have perWorkerCalls calls in
// flight, the node's workers together relayedCalls, and the agent keeps
// the rest of the connection's streams for itself; a call over budget is
// refused at once with ResourceExhausted, naming the rank and the budget.

const (
	// perWorkerCalls is one worker's budget: a rank waits in a Barrier or
	// a KVGet, or a few at once from several threads; a rendezvous library
	// polling many keys in parallel stays well within it.
	perWorkerCalls = 64
	// relayedCalls is the budget of all the node's workers together: two
	// calls for each of up to 1024 workers a node
	// (coordinator.MaxNprocPerNode), as the coordinator's per-connection
	// bound assumes, leaving its 64 other streams to the agent's own calls
	// (the watch stream, reports, exits).
	relayedCalls = 2048
)

// budget counts the relayed calls in flight, by worker. It decides only;
// callers say which worker a call is from (workerOf).
type budget struct {
	perWorker, total int

	mu    sync.Mutex
	calls map[int]int // worker key -> calls in flight
	all   int
}

func newBudget(perWorker, total int) *budget {
	return &budget{perWorker: perWorker, total: total, calls: map[int]int{}}
}

// errOverBudget says which budget a refused call was over.
type errOverBudget struct {
	worker bool // the worker's own budget; false: the node's
	limit  int
}

func (e errOverBudget) Error() string {
	if e.worker {
		return fmt.Sprintf("this worker has %d calls waiting at the coordinator through its agent, its budget", e.limit)
	}
	return fmt.Sprintf("this node's workers have %d calls waiting at the coordinator through their agent, the node's budget", e.limit)
}

// take counts a call of worker key, or says which budget it is over.
func (b *budget) take(key int) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch {
	case b.calls[key] >= b.perWorker:
		return errOverBudget{worker: true, limit: b.perWorker}
	case b.all >= b.total:
		return errOverBudget{limit: b.total}
	}
	b.calls[key]++
	b.all++
	return nil
}

// give ends a call of worker key that take counted.
func (b *budget) give(key int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.calls[key]--; b.calls[key] <= 0 {
		delete(b.calls, key)
	}
	b.all--
}

// workerOf returns the key a call's budget is kept under — the process
// group of the calling process (each worker is started in a group of its
// own, and the processes it forks stay in it), else its pid, else 0 — and
// how to name it: the rank the agent started there, when it knows.
func (r *Server) workerOf(ctx context.Context) (key int, who string) {
	pid := peerPidOf(ctx)
	if pid <= 0 {
		return 0, "a worker (pid unknown)"
	}
	key = pid
	if pgid, err := unix.Getpgid(pid); err == nil && pgid > 0 {
		key = pgid
	}
	who = fmt.Sprintf("pid %d", pid)
	if r.Claims != nil {
		if p, leader, ok := r.Claims.known(pid); ok {
			who = fmt.Sprintf("%s (pid %d)", p, leader)
		}
	}
	return key, who
}

// relayed runs call, one of a worker's calls to the coordinator, within
// the relay's budget: refused with ResourceExhausted, saying whose call
// and what to do, when it is over.
func relayed[T any](r *Server, ctx context.Context, method string, call func() (T, error)) (T, error) {
	b := r.budget()
	key, who := r.workerOf(ctx)
	if err := b.take(key); err != nil {
		host, _ := os.Hostname()
		var zero T
		if r.Log != nil {
			r.Log.Warn("relayed call refused", "method", method, "worker", who, "err", err)
		}
		return zero, status.Errorf(codes.ResourceExhausted,
			"%s on %s: %s refused: %v; a call returns once its key or barrier comes or its deadline passes: give long waits a deadline, or wait for fewer keys at once",
			who, host, method, err)
	}
	defer b.give(key)
	return call()
}
