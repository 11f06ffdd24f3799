package ncclcomm

import "sync"

// abortHooks are the functions OnAbort registered, run when an abort starts.
type abortHooks struct {
	mu    sync.Mutex
	next  int
	hooks map[int]func()
}

// OnAbort registers fn to run (once per abort, on the aborting goroutine,
// before NCCL's abort) when the communicator is aborted: the place for work
// that waits on the device for something besides NCCL's kernels — a stream
// waiting for a peer's flag — to be released, as ncclCommAbort releases
// NCCL's own kernels. fn must not call c's methods and must not block.
// remove unregisters it.
func (c *Comm) OnAbort(fn func()) (remove func()) {
	h := &c.onAbort
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.hooks == nil {
		h.hooks = make(map[int]func())
	}
	id := h.next
	h.next++
	h.hooks[id] = fn
	return func() {
		h.mu.Lock()
		defer h.mu.Unlock()
		delete(h.hooks, id)
	}
}

func (c *Comm) runAbortHooks() {
	h := &c.onAbort
	h.mu.Lock()
	fns := make([]func(), 0, len(h.hooks))
	for _, fn := range h.hooks {
		fns = append(fns, fn)
	}
	h.mu.Unlock()
	for _, fn := range fns {
		fn()
	}
}
