package main

import (
	"fmt"

	"github.com/gotrain/gotrain/cmd/gotrain/internal/doctor"
	"github.com/gotrain/gotrain/internal/launcher"
	"github.com/gotrain/gotrain/nccl"
)

// checkRanksPerGPU refuses a --ranks-per-gpu that can never work, before
// anything starts: below 1, on the CPU backend, or with an NCCL older than
// 2.30 (whose init fails on a second rank of one GPU, on every rank). given
// says whether the flag was on the command line.
func checkRanksPerGPU(cfg *launcher.Config, given bool) error {
	switch {
	case !given:
		return nil
	case cfg.RanksPerGPU < 1:
		return &usageError{msg: fmt.Sprintf("--ranks-per-gpu %d", cfg.RanksPerGPU), hint: "Give 1 or more workers per GPU (e.g. --ranks-per-gpu 4 --nproc-per-node 4 on one GPU)."}
	case cfg.RanksPerGPU == 1:
		return nil
	case cfg.Backend == "cpu":
		return &usageError{msg: fmt.Sprintf("--ranks-per-gpu %d with --backend cpu: CPU ranks use no GPU", cfg.RanksPerGPU), hint: "Drop --ranks-per-gpu, or run on GPUs with --backend nccl."}
	}
	lib, err := nccl.Load()
	if err != nil {
		return fmt.Errorf("--ranks-per-gpu %d needs NCCL %s or newer: %w", cfg.RanksPerGPU, doctor.MultiRankNCCL, err)
	}
	if lib.Version() < doctor.MultiRankNCCL {
		return fmt.Errorf("--ranks-per-gpu %d needs NCCL %s or newer (several ranks of one communicator on one GPU), but the NCCL workers would load is %s at %s: point %s at a newer libnccl.so.2, or run one worker per GPU",
			cfg.RanksPerGPU, doctor.MultiRankNCCL, lib.Version(), lib.Path(), nccl.LibraryEnv)
	}
	return nil
}
