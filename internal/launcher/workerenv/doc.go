// Package workerenv is what the agent adds to a worker's command line and
// environment beyond its identity (internal/jobenv): torchrun's
// ${local_rank} macro in the arguments, and the PyTorch NCCL error
// handling and flight-recorder settings torchrun's workers expect.
//
// It is separate from the agent (package launcher) because it is pure
// string work, the same for a worker, a Go standby and a Python standby,
// and is tested as such.
package workerenv
