package comm

// Aborter is a communicator that can be torn down from any goroutine while
// a collective is in progress, without waiting for its peers: the collective
// fails promptly and the communicator is unusable afterwards. In-process
// recovery (worker.Run) aborts the communicator of a generation that ended,
// because a peer died and a collective may never complete. The NCCL backend
// implements it with ncclCommAbort on a non-blocking communicator, so that
// the abort itself cannot hang; the CPU backend closes its connections.
type Aborter interface {
	Abort() error
}

// Unwrapper is a communicator that wraps another (a flight recorder).
type Unwrapper interface {
	Unwrap() Comm
}

// Abort aborts c, or the first communicator it wraps that is an Aborter;
// a communicator that is neither is closed.
func Abort(c Comm) error {
	for c != nil {
		if a, ok := c.(Aborter); ok {
			return a.Abort()
		}
		u, ok := c.(Unwrapper)
		if !ok {
			break
		}
		inner := u.Unwrap()
		if inner == nil {
			break
		}
		c = inner
	}
	if c == nil {
		return nil
	}
	return c.Close()
}
