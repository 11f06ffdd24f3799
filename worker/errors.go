package worker

import "github.com/gotrain/gotrain/internal/peermem"

// CopyEngineUnavailableError is what NewDataParallel returns, wrapped, when
// DataParallelConfig.Transport is TransportCopyEngine and the ranks cannot
// map each other's device memory: they are on different nodes, a GPU is not
// visible to another rank's process, there is no peer path, or (past two
// ranks) the gradients are not memory CUDA IPC can share. Every rank gets
// one. Its fields:
//
//	Transport string // the transport that answered: "pairreduce" or "nodereduce"
//	Rank      int    // the rank that reports it
//	Reason    string // why, e.g. "rank 3 is on another node"
//
// Find it with errors.As, or errors.Is(err, ErrCopyEngineUnavailable);
// with TransportAuto NewDataParallel falls back to NCCL instead.
type CopyEngineUnavailableError = peermem.UnavailableError

// ErrCopyEngineUnavailable matches (errors.Is) every
// CopyEngineUnavailableError.
var ErrCopyEngineUnavailable = peermem.ErrUnavailable
