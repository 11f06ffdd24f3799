package cudadrv

// The stream-ordering calls: what overlapping communication with computation
// needs on top of streams and events.

var streamCalls = callSet{open: cStreamOpen}

func openStreamCalls() error { return streamCalls.ensure() }

// WaitEvent makes the work enqueued on s after this call wait until e's last
// record has completed (cuStreamWaitEvent); the host does not wait.
func (s Stream) WaitEvent(e Event) error {
	if err := openStreamCalls(); err != nil {
		return err
	}
	return check("cuStreamWaitEvent", cStreamWaitEvent(s, e))
}

// CopyDeviceToDeviceAsync enqueues a copy of bytes from src to dst on s
// (cuMemcpyDtoDAsync).
func CopyDeviceToDeviceAsync(dst, src DevicePtr, bytes int, s Stream) error {
	if err := openStreamCalls(); err != nil {
		return err
	}
	return check("cuMemcpyDtoDAsync", cMemcpyDtoDAsync(dst, src, bytes, s))
}

// NewStreamWithPriority creates a stream in the current context with a
// priority (cuStreamCreateWithPriority); lower numbers run first, see
// StreamPriorityRange.
func NewStreamWithPriority(flags uint32, priority int) (Stream, error) {
	if err := openStreamCalls(); err != nil {
		return 0, err
	}
	s, r := cStreamCreateWithPriority(flags, priority)
	return s, check("cuStreamCreateWithPriority", r)
}

// StreamPriorityRange returns the current context's stream priorities
// (cuCtxGetStreamPriorityRange): least is the default, greatest (a smaller
// number) the most urgent.
func StreamPriorityRange() (least, greatest int, err error) {
	if err := openStreamCalls(); err != nil {
		return 0, 0, err
	}
	l, g, r := cStreamPriorityRange()
	return l, g, check("cuCtxGetStreamPriorityRange", r)
}
