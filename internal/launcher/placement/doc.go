// Package placement is where a node's workers go on its GPUs and CPUs: the
// node's GPUs in NVLink order (the coordinator hands local rank i the i-th),
// each worker's CUDA_VISIBLE_DEVICES and CUDA_DEVICE_ORDER, the NCCL
// settings of ranks that share a GPU, the pinning of a worker to its GPU's
// CPUs, and how many GPUs the machine has (FindGPUs, for cmd/gotrain's
// defaults).
//
// It is separate from the agent (package launcher) because it only reads
// the machine (NVML, /dev/nvidia*) and computes: it keeps no state of the
// job, and cmd/gotrain uses it before any agent runs.
package placement
