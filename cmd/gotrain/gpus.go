package main

import (
	"fmt"

	"github.com/gotrain/gotrain/internal/launcher"
	"github.com/gotrain/gotrain/internal/launcher/placement"
)

// chooseBackend settles gotrain launch's worker count and backend from the
// flags and the GPUs found, refusing what the machine cannot do. --gpus N
// means N GPUs: without them it is an error that says what was found and
// how to run on CPUs. CPU workers run when asked (--backend cpu); the one
// exception is --nproc-per-node N without --backend on a machine without
// GPUs (torchrun's flag counts processes, not GPUs), which runs on the CPU
// backend with a warning (warn) saying so. given names the flags on the
// command line.
//
// With --ranks-per-gpu K (several NCCL ranks per GPU) the machine holds up
// to K workers per GPU: capacity is GPUs × K.
func chooseBackend(cfg *launcher.Config, given map[string]bool, found placement.GPUs, warn func(string)) error {
	n := cfg.NprocPerNode
	capacity := found.N * max(cfg.RanksPerGPU, 1)
	onCPUs := func(k int) string {
		if k <= 0 {
			return "To run on CPUs, pass --backend cpu --nproc-per-node N (e.g. --nproc-per-node 4)."
		}
		return fmt.Sprintf("To run on CPUs, pass --backend cpu --nproc-per-node %d.", k)
	}
	noGPU := func(asked string, k int) error {
		return &usageError{msg: fmt.Sprintf("%s, but this machine has no NVIDIA GPU (%s)", asked, found.How), hint: onCPUs(k)}
	}
	tooFew := func(asked string, k int) error {
		return &usageError{msg: fmt.Sprintf("%s, but this machine has %d NVIDIA GPU(s) (%s)", asked, found.N, found.How),
			hint: fmt.Sprintf("Run one worker per GPU (%d or fewer; leave the count out for all of them; up to K per GPU with --ranks-per-gpu K on NCCL ≥ 2.30), or on CPUs: --backend cpu --nproc-per-node %d.", capacity, k)}
	}
	if given["gpus"] {
		switch {
		case given["nproc-per-node"]:
			return &usageError{msg: "--gpus and --nproc-per-node both given", hint: "Give one: --gpus N runs N workers on N GPUs; --nproc-per-node N --backend cpu runs N on CPUs."}
		case cfg.Backend == "cpu":
			return &usageError{msg: fmt.Sprintf("--gpus %d with --backend cpu", n), hint: fmt.Sprintf("--gpus asks for GPUs. %s To run on GPUs, drop --backend cpu.", onCPUs(n))}
		case found.N == 0:
			return noGPU(fmt.Sprintf("--gpus %d", n), n)
		case n > capacity:
			return tooFew(fmt.Sprintf("--gpus %d", n), n)
		}
		cfg.Backend = "nccl"
		return nil
	}
	switch cfg.Backend {
	case "nccl":
		if found.N == 0 {
			return noGPU("--backend nccl", n)
		}
		if n == 0 {
			n = capacity
		}
		if n > capacity {
			return tooFew(fmt.Sprintf("--nproc-per-node %d with --backend nccl", n), n)
		}
	case "cpu":
		if n == 0 {
			if found.N == 0 {
				return &usageError{msg: fmt.Sprintf("--backend cpu without --nproc-per-node, and no NVIDIA GPU found on this machine (%s) to count workers by", found.How), hint: onCPUs(0)}
			}
			n = found.N // as many CPU workers as GPUs
		}
	default: // not given
		switch {
		case found.N > 0 && n == 0:
			n, cfg.Backend = capacity, "nccl"
		case found.N > 0 && n > capacity:
			return tooFew(fmt.Sprintf("--nproc-per-node %d", n), n)
		case found.N > 0:
			cfg.Backend = "nccl"
		case n == 0:
			return &usageError{msg: fmt.Sprintf("no NVIDIA GPU found on this machine (%s), so there is no default worker count", found.How), hint: onCPUs(0)}
		default:
			cfg.Backend = "cpu"
			warn(fmt.Sprintf("gotrain: warning: no NVIDIA GPU on this machine (%s): the %d workers run on the CPU backend; pass --backend cpu to say so, or --gpus %d to require GPUs", found.How, n, n))
		}
	}
	cfg.NprocPerNode = n
	return nil
}
