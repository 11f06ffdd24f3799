// Package observe is what the agent finds out about its workers from
// outside them, beyond what they tell it over the agent socket: the GPUs'
// samples, throttling and XID errors (NVML), collective-level progress of
// ranks that do not attach (NCCL RAS on NCCL jobs, the PyTorch hook's
// records on gloo), each rank's step rate, and, when a worker ended badly,
// the root cause the node can see (OOM kills, XIDs in the kernel log, the
// program's error file).
//
// It is separate from the agent (package launcher) because none of it
// decides anything: each observer reads the node and annotates a rank's
// progress or exit report, through small exported calls the agent's hub
// and exit reports make. It knows nothing of the agent, its machine or its
// socket: the ranks it watches come in as plain values (RASSource, the
// owner of a GPU as a func), so it is tested on its own with fakes.
package observe
